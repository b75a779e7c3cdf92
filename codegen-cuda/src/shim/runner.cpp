// modelc CPU shim: the runner linked with a kernel translation unit (a generated source and
// the launch table the harness appends). It reads the three buffers of the kernel ABI from
// files, runs a list of launches and writes `arena` and `kv` back.
//
//   runner ARENA KV WTS LAUNCHES
//
// LAUNCHES holds one launch a line: `name gx gy gz block`. Errors go to stderr as lines
// starting with `runner:`, with exit status 2.
//
// Threads of a block run concurrently with barrier semantics, in one of two ways:
// - fibers (the default): each worker OS thread runs whole blocks; a block's threads are
//   fibers (own stacks, switched by hand) that the worker schedules round-robin: a thread
//   runs until it reaches a barrier (SYNC, a shuffle) or ends; a barrier opens when every
//   thread it concerns has reached it. A barrier that can never open (a SYNC some threads
//   skip, a shuffle not every lane makes) is reported, not hung on. Blocks of a launch run
//   on `min(cores, blocks)` workers at once (MODELC_SHIM_WORKERS overrides).
// - OS threads (SHIM_THREADS, for ThreadSanitizer): a block's threads are OS threads that
//   meet at real barriers (mutex and condition variable: a SYNC is a happens-before edge of
//   the whole block, a shuffle one of its warp only), so TSan sees exactly the
//   synchronisation a GPU gives. Blocks run one at a time.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "shim_abi.h"

#ifndef SHIM_THREADS
#include <sys/mman.h>
#include <unistd.h>
#if !defined(__x86_64__) && !defined(SHIM_UCONTEXT)
#define SHIM_UCONTEXT
#endif
#ifdef SHIM_UCONTEXT
#include <ucontext.h>
#endif
#endif

extern "C" {
__thread shim_dim3 shim_thread_idx;
__thread shim_dim3 shim_block_idx;
__thread shim_dim3 shim_block_dim;
__thread shim_dim3 shim_grid_dim;
}

static constexpr int WARP = 32;

[[noreturn]] __attribute__((format(printf, 1, 2))) static void fail(const char* fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    std::vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    std::fprintf(stderr, "runner: %s\n", msg);
    std::fflush(stderr);
    std::_Exit(2);
}

struct Launch {
    std::string name;
    shim_kernel_fn fn;
    unsigned grid[3];
    unsigned block;
    unsigned long long ops[SHIM_MAX_OPERANDS];
};

struct Buffers {
    unsigned char* arena;
    unsigned char* kv;
    const unsigned char* wts;
    const unsigned long long* ops;  // the current launch's operand offsets
};

// The launch being run (for messages).
static const Launch* g_launch = nullptr;

#ifndef SHIM_THREADS
// ---------------------------------------------------------------------------------------
// Fibers
// ---------------------------------------------------------------------------------------

enum FiberState { RUNNABLE, AT_SYNC, AT_WARP, DONE };

static constexpr size_t STACK_BYTES = 256 * 1024;

struct Fiber {
#ifdef SHIM_UCONTEXT
    ucontext_t ctx;
#else
    void* sp;
#endif
    unsigned char* stack;  // lowest usable byte (a guard page lies below)
    int state;
    int parity;  // which of the two shuffle buffers the next shuffle uses
    size_t color;  // bytes left free at the stack's top
};

struct Worker {
#ifdef SHIM_UCONTEXT
    ucontext_t sched;
#else
    void* sched_sp;
#endif
    std::vector<Fiber> fibers;
    int cur = 0;
    shim_kernel_fn fn = nullptr;
    Buffers buf{};
    unsigned bx = 0, by = 0, bz = 0;
    unsigned shfl[2][1024];
    int ready[1024];
};

static thread_local Worker* t_worker = nullptr;

#ifndef SHIM_UCONTEXT
// shim_switch(save, to): saves the callee-saved registers on the current stack, stores the
// stack pointer in *save, and continues on the stack `to` (popping what an earlier switch
// saved there, or what fiber_init laid out). It leaves by an indirect jump, not `ret`: a
// `ret` to another stack's caller misses the return stack buffer at every switch, and that
// made switches four times as slow.
extern "C" void shim_switch(void** save, void* to);
asm(R"(
    .text
    .globl shim_switch
    .type shim_switch, @function
shim_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    popq %rcx
    jmp *%rcx
    .size shim_switch, .-shim_switch
    .section .note.GNU-stack,"",@progbits
    .text
)");
#endif

[[noreturn]] static void fiber_main() {
    Worker* w = t_worker;
    const int t = w->cur;
    w->fn(w->buf.arena, w->buf.kv, w->buf.wts, w->buf.ops, w->bx, w->by, w->bz, (unsigned)t);
    w = t_worker;
    Fiber& f = w->fibers[w->cur];
    f.state = DONE;
#ifdef SHIM_UCONTEXT
    setcontext(&w->sched);
#else
    // (Into the fiber's own field: a local whose address is taken would leave AddressSanitizer
    // redzones on a stack the next block reuses.)
    shim_switch(&f.sp, w->sched_sp);
#endif
    __builtin_unreachable();
}

static void fiber_init(Worker* w, Fiber& f) {
    f.state = RUNNABLE;
    f.parity = 0;
#ifdef SHIM_UCONTEXT
    getcontext(&f.ctx);
    f.ctx.uc_stack.ss_sp = f.stack;
    f.ctx.uc_stack.ss_size = STACK_BYTES;
    f.ctx.uc_link = &w->sched;
    makecontext(&f.ctx, (void (*)())fiber_main, 0);
#else
    (void)w;
    // Stack tops at different offsets modulo the page: otherwise every fiber's hot frames
    // fall in the same cache sets and evict each other at every switch.
    uintptr_t top = ((uintptr_t)(f.stack + STACK_BYTES - f.color)) & ~(uintptr_t)15;
    void** sp = (void**)top;
    *--sp = nullptr;                   // fiber_main's return address (never used)
    *--sp = (void*)&fiber_main;        // where shim_switch's `ret` goes
    for (int i = 0; i < 6; i++) *--sp = nullptr;  // rbp rbx r12 r13 r14 r15
    f.sp = sp;
#endif
}

// Back to the scheduler, in state `st`; returns when the scheduler resumes this thread.
static inline void fiber_yield(Worker* w, int st) {
    Fiber& f = w->fibers[w->cur];
    f.state = st;
#ifdef SHIM_UCONTEXT
    swapcontext(&f.ctx, &w->sched);
#else
    shim_switch(&f.sp, w->sched_sp);
#endif
}

static void alloc_stacks(Worker* w, int nt) {
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    const int have = (int)w->fibers.size();
    if (have >= nt) return;
    const size_t per = STACK_BYTES + page;
    const size_t n = (size_t)(nt - have);
    unsigned char* mem = (unsigned char*)mmap(nullptr, per * n, PROT_READ | PROT_WRITE,
                                              MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (mem == MAP_FAILED) fail("cannot map fiber stacks");
    w->fibers.resize((size_t)nt);
    for (size_t i = 0; i < n; i++) {
        unsigned char* base = mem + i * per;
        mprotect(base, page, PROT_NONE);  // a stack overflow faults instead of corrupting
        w->fibers[(size_t)have + i].stack = base + page;
        w->fibers[(size_t)have + i].color = (((size_t)have + i) * 7 % 64) * 64 + 64;
    }
}

static void describe_stuck(const Worker* w, int nt, char* out, size_t cap) {
    int sync = 0, warp = 0, done = 0;
    for (int i = 0; i < nt; i++) {
        int s = w->fibers[(size_t)i].state;
        sync += s == AT_SYNC;
        warp += s == AT_WARP;
        done += s == DONE;
    }
    std::snprintf(out, cap,
                  "%d threads wait at SYNC, %d at a shuffle, %d have returned: a barrier "
                  "not every thread reaches",
                  sync, warp, done);
}

static void run_block(Worker* w, int nt) {
    int* ready = w->ready;  // the threads to resume in this sweep
    int n = nt;
    for (int i = 0; i < nt; i++) {
        fiber_init(w, w->fibers[(size_t)i]);
        ready[i] = i;
    }
    int done = 0, at_sync = 0;
    int at_warp[1024 / WARP] = {};
    for (;;) {
        for (int k = 0; k < n; k++) {
            const int i = ready[k];
            Fiber& f = w->fibers[(size_t)i];
            w->cur = i;
            shim_thread_idx.x = (unsigned)i;
#ifdef SHIM_UCONTEXT
            swapcontext(&w->sched, &f.ctx);
#else
            shim_switch(&w->sched_sp, f.sp);
#endif
            switch (f.state) {
                case DONE: done++; break;
                case AT_SYNC: at_sync++; break;
                case AT_WARP: at_warp[i / WARP]++; break;
            }
        }
        if (done == nt) return;
        // Nothing is runnable: open the barriers every thread concerned has reached.
        n = 0;
        for (int wp = 0; wp < nt / WARP; wp++) {
            if (at_warp[wp] != WARP) continue;
            at_warp[wp] = 0;
            for (int l = wp * WARP; l < (wp + 1) * WARP; l++) {
                w->fibers[(size_t)l].state = RUNNABLE;
                ready[n++] = l;
            }
        }
        if (n == 0 && at_sync == nt) {
            at_sync = 0;
            for (int i = 0; i < nt; i++) {
                w->fibers[(size_t)i].state = RUNNABLE;
                ready[n++] = i;
            }
        }
        if (n == 0) {
            char why[256];
            describe_stuck(w, nt, why, sizeof why);
            fail("kernel %s, block (%u,%u,%u): %s", g_launch->name.c_str(), w->bx, w->by, w->bz,
                 why);
        }
    }
}

extern "C" void shim_sync_block(void) { fiber_yield(t_worker, AT_SYNC); }

// Publishes the calling thread's `v` to its warp and waits for the warp's other lanes:
// the warp's 32 values, in lane order (valid until the thread's next exchange but one).
static const unsigned* warp_exchange(unsigned v) {
    Worker* w = t_worker;
    const int t = w->cur;
    Fiber& f = w->fibers[(size_t)t];
    const int p = f.parity;
    f.parity ^= 1;
    w->shfl[p][t] = v;
    fiber_yield(w, AT_WARP);
    return &w->shfl[p][t & ~(WARP - 1)];
}

extern "C" unsigned shim_shfl_xor(unsigned v, int m) {
    const int lane = t_worker->cur & (WARP - 1);
    return warp_exchange(v)[(lane ^ m) & (WARP - 1)];
}

extern "C" void shim_warp_all(unsigned v, unsigned* all) {
    const unsigned* w = warp_exchange(v);
    for (int i = 0; i < WARP; i++) all[i] = w[i];
}

static std::vector<Worker*> g_workers;

static void run_launch(const Launch& l, const Buffers& b) {
    const unsigned long nblocks = (unsigned long)l.grid[0] * l.grid[1] * l.grid[2];
    unsigned nw = std::thread::hardware_concurrency();
    if (const char* e = std::getenv("MODELC_SHIM_WORKERS")) nw = (unsigned)std::atoi(e);
    if (nw == 0) nw = 1;
    if (nw > nblocks) nw = (unsigned)nblocks;
    while (g_workers.size() < nw) g_workers.push_back(new Worker());
    std::atomic<unsigned long> next{0};
    auto work = [&](Worker* w) {
        t_worker = w;
        alloc_stacks(w, (int)l.block);
        w->fn = l.fn;
        w->buf = b;
        shim_block_dim = {l.block, 1, 1};
        shim_grid_dim = {l.grid[0], l.grid[1], l.grid[2]};
        for (;;) {
            unsigned long i = next.fetch_add(1, std::memory_order_relaxed);
            if (i >= nblocks) break;
            w->bx = (unsigned)(i % l.grid[0]);
            w->by = (unsigned)((i / l.grid[0]) % l.grid[1]);
            w->bz = (unsigned)(i / ((unsigned long)l.grid[0] * l.grid[1]));
            shim_block_idx = {w->bx, w->by, w->bz};
            run_block(w, (int)l.block);
        }
    };
    if (nw == 1) {
        work(g_workers[0]);
        return;
    }
    std::vector<std::thread> ts;
    for (unsigned i = 1; i < nw; i++) ts.emplace_back(work, g_workers[i]);
    work(g_workers[0]);
    for (auto& t : ts) t.join();
}

#else
// ---------------------------------------------------------------------------------------
// OS threads
// ---------------------------------------------------------------------------------------

// A reusable barrier of `n` threads. A thread that waits longer than the deadline reports a
// barrier that is never completed (a SYNC some threads skip) instead of hanging.
struct Barrier {
    std::mutex mu;
    std::condition_variable cv;
    int n = 0;
    int arrived = 0;
    unsigned long gen = 0;
    const char* kind = nullptr;  // what the threads waiting now wait at
    void wait(const char* what) {
        std::unique_lock<std::mutex> lk(mu);
        const unsigned long g = gen;
        if (arrived == 0) kind = what;
        if (kind != what)
            fail("kernel %s, block (%u,%u,%u): threads wait at a %s and at a %s: a barrier not "
                 "every thread reaches",
                 g_launch->name.c_str(), shim_block_idx.x, shim_block_idx.y, shim_block_idx.z,
                 kind, what);
        if (++arrived == n) {
            arrived = 0;
            gen++;
            cv.notify_all();
            return;
        }
        if (!cv.wait_for(lk, std::chrono::seconds(30), [&] { return gen != g; }))
            fail("kernel %s, block (%u,%u,%u): a %s not every thread reaches (deadlock)",
                 g_launch->name.c_str(), shim_block_idx.x, shim_block_idx.y, shim_block_idx.z,
                 what);
    }
};

static Barrier g_block;                  // SYNC and the end of a block
static std::vector<Barrier*> g_warps;    // one per warp: shuffles
static unsigned g_shfl[2][1024];
static thread_local int t_parity = 0;

extern "C" void shim_sync_block(void) { g_block.wait("SYNC"); }

// As the fiber runner's warp_exchange: the warp's 32 values after a barrier of the warp.
static const unsigned* warp_exchange(unsigned v) {
    const int t = (int)shim_thread_idx.x;
    const int p = t_parity;
    t_parity ^= 1;
    g_shfl[p][t] = v;
    g_warps[(size_t)(t / WARP)]->wait("shuffle");
    return &g_shfl[p][t & ~(WARP - 1)];
}

extern "C" unsigned shim_shfl_xor(unsigned v, int m) {
    const int lane = (int)shim_thread_idx.x & (WARP - 1);
    return warp_exchange(v)[(lane ^ m) & (WARP - 1)];
}

extern "C" void shim_warp_all(unsigned v, unsigned* all) {
    const unsigned* w = warp_exchange(v);
    for (int i = 0; i < WARP; i++) all[i] = w[i];
}

static void run_launch(const Launch& l, const Buffers& b) {
    const int nt = (int)l.block;
    g_block.n = nt;
    for (int i = 0; i < nt / WARP; i++) {
        if ((size_t)i >= g_warps.size()) g_warps.push_back(new Barrier());
        g_warps[(size_t)i]->n = WARP;
    }
    auto thread_main = [&](int t) {
        shim_thread_idx = {(unsigned)t, 0, 0};
        shim_block_dim = {l.block, 1, 1};
        shim_grid_dim = {l.grid[0], l.grid[1], l.grid[2]};
        t_parity = 0;
        for (unsigned z = 0; z < l.grid[2]; z++)
            for (unsigned y = 0; y < l.grid[1]; y++)
                for (unsigned x = 0; x < l.grid[0]; x++) {
                    shim_block_idx = {x, y, z};
                    l.fn(b.arena, b.kv, b.wts, b.ops, x, y, z, (unsigned)t);
                    // The block's end: its shared memory is the next block's.
                    g_block.wait("return");
                }
    };
    std::vector<std::thread> ts;
    for (int t = 0; t < nt; t++) ts.emplace_back(thread_main, t);
    for (auto& t : ts) t.join();
}
#endif

// ---------------------------------------------------------------------------------------
// main
// ---------------------------------------------------------------------------------------

static unsigned char* read_file(const char* path, size_t* len) {
    FILE* f = std::fopen(path, "rb");
    if (!f) fail("cannot open %s", path);
    std::fseek(f, 0, SEEK_END);
    long n = std::ftell(f);
    std::fseek(f, 0, SEEK_SET);
    if (n < 0) fail("cannot read %s", path);
    void* p = nullptr;
    // The alignment cudaMalloc gives; at least one byte so that the pointer is real.
    if (posix_memalign(&p, 256, n > 0 ? (size_t)n : 1) != 0) fail("out of memory for %s", path);
    if (n > 0 && std::fread(p, 1, (size_t)n, f) != (size_t)n) fail("cannot read %s", path);
    std::fclose(f);
    *len = (size_t)n;
    return (unsigned char*)p;
}

static void write_file(const char* path, const unsigned char* p, size_t n) {
    FILE* f = std::fopen(path, "wb");
    if (!f) fail("cannot create %s", path);
    if (n > 0 && std::fwrite(p, 1, n, f) != n) fail("cannot write %s", path);
    if (std::fclose(f) != 0) fail("cannot write %s", path);
}

int main(int argc, char** argv) {
    if (argc != 5) fail("usage: runner ARENA KV WTS LAUNCHES");
    size_t na, nk, nw;
    Buffers b;
    b.arena = read_file(argv[1], &na);
    b.kv = read_file(argv[2], &nk);
    b.wts = read_file(argv[3], &nw);

    std::vector<Launch> launches;
    FILE* f = std::fopen(argv[4], "r");
    if (!f) fail("cannot open %s", argv[4]);
    char name[256];
    Launch l;
    while (std::fscanf(f, "%255s %u %u %u %u", name, &l.grid[0], &l.grid[1], &l.grid[2],
                       &l.block) == 5) {
        for (int i = 0; i < SHIM_MAX_OPERANDS; i++)
            if (std::fscanf(f, "%llu", &l.ops[i]) != 1) fail("kernel %s: operands missing", name);
        l.name = name;
        l.fn = nullptr;
        for (int i = 0; i < shim_table_len; i++)
            if (std::strcmp(shim_table[i].name, name) == 0) l.fn = shim_table[i].fn;
        if (!l.fn) fail("no kernel %s in the launch table", name);
        if (l.block == 0 || l.block % WARP != 0 || l.block > 1024)
            fail("kernel %s: %u threads per block (a multiple of 32, at most 1024)", name,
                 l.block);
        if (l.grid[0] == 0 || l.grid[1] == 0 || l.grid[2] == 0)
            fail("kernel %s: an empty grid", name);
        launches.push_back(l);
    }
    std::fclose(f);

    const bool timing = std::getenv("MODELC_SHIM_TIMING") != nullptr;
    for (const Launch& x : launches) {
        g_launch = &x;
        auto t0 = std::chrono::steady_clock::now();
        Buffers lb = b;
        lb.ops = x.ops;
        run_launch(x, lb);
        if (timing) {
            double ms = std::chrono::duration<double, std::milli>(
                            std::chrono::steady_clock::now() - t0)
                            .count();
            std::printf("%s %u,%u,%u x %u: %.3f ms\n", x.name.c_str(), x.grid[0], x.grid[1],
                        x.grid[2], x.block, ms);
        }
    }
    write_file(argv[1], b.arena, na);
    write_file(argv[2], b.kv, nk);
    return 0;
}
