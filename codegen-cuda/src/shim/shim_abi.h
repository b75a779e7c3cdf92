// modelc CPU shim: the interface between a kernel translation unit (generated source + the
// launch table the harness appends) and runner.cpp. Shared by both dialects.
#pragma once

extern "C" {

// One entry of the launch table: the kernel's name and a wrapper that runs one thread of it.
// The wrapper takes the three buffers of the ABI, the launch's operand offsets (the
// kernel's `Operands`: SHIM_MAX_OPERANDS of them), the block index and the thread index.
#define SHIM_MAX_OPERANDS 16
typedef void (*shim_kernel_fn)(unsigned char* arena, unsigned char* kv, const unsigned char* wts,
                               const unsigned long long* ops, unsigned bx, unsigned by,
                               unsigned bz, unsigned tx);
struct shim_entry {
    const char* name;
    shim_kernel_fn fn;
};
extern const shim_entry shim_table[];
extern const int shim_table_len;

// The index of the current thread in its block and of its block in the grid, set by the
// runner before it runs (or resumes) a thread. `__thread` (no dynamic initialisation): the
// kernel TU reads them directly.
struct shim_dim3 {
    unsigned x, y, z;
};
extern __thread shim_dim3 shim_thread_idx;
extern __thread shim_dim3 shim_block_idx;
extern __thread shim_dim3 shim_block_dim;
extern __thread shim_dim3 shim_grid_dim;

// Barrier of the block's threads (CUDA __syncthreads, Metal threadgroup_barrier).
void shim_sync_block(void);
// The 32-bit value of lane `lane ^ m` of the calling thread's 32-lane warp; every lane of
// the warp must call it (it is a barrier of the warp).
unsigned shim_shfl_xor(unsigned v, int m);
// Every lane's `v` of the calling thread's warp, in lane order, into `all[32]`; every lane
// of the warp must call it (a barrier of the warp, as a shuffle).
void shim_warp_all(unsigned v, unsigned* all);
}

// Storage of a block's shared memory. Fiber runs (the default): each worker OS thread runs
// whole blocks, one at a time, so a thread-local static is the block's shared memory. OS
// thread runs (SHIM_THREADS, used for ThreadSanitizer): a block's threads are OS threads and
// blocks run one at a time, so a plain static is.
#ifdef SHIM_THREADS
#define SHIM_SHARED_STORAGE static
#else
#define SHIM_SHARED_STORAGE static thread_local
#endif

template <class T>
static inline T shim_shfl_xor_t(T v, int m) {
    static_assert(sizeof(T) == 4, "shuffles of 32-bit values only");
    return __builtin_bit_cast(T, shim_shfl_xor(__builtin_bit_cast(unsigned, v), m));
}
