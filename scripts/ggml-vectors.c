// ggml-vectors: writes test vectors of llama.cpp's own CPU library for the weight types
// given on the command line (dev time only; CI uses the committed output).
//
// For each type: dequantized values of random blocks (`to_float`), `vec_dot` of random
// weight rows with activations quantized by ggml (`from_float` of the `vec_dot_type`) and
// with raw random activation blocks, and whole `mul_mat` products (ggml graph, one thread)
// with 1 and 9 activation columns, so the kernel `mul_mat` picks for prompts (ggml-cpu's
// tiled kernel for the IQ types) is covered too. For the 32-value types, also `vec_dot` of
// 3-block rows (the AVX2 kernels' scalar tail) and, for the types the x86 build repacks
// (Q4_0, IQ4_NL, MXFP4), `mul_mat` with the weight in the CPU backend's `CPU_REPACK` buffer
// (the interleaved gemv / gemm kernels llama.cpp runs for model weights). The Rust side is
// `ir/tests/ggml_vectors.rs`, which documents the file format. (Q4_0 is accepted but not in
// the committed file: its raw-activation `vec_dot` records hold -128 bytes, which the AVX2
// sign trick wraps and `ir::ggml::vec_dot_avx2` does not model for Q4_0; x86 Q8_0
// activations never hold -128.)
//
// Build and run (paths of the llama.cpp build whose arithmetic modelc reproduces):
//   L=/work/llama/llama_cpp_python-0.3.36/vendor/llama.cpp
//   cc -O2 -o /tmp/ggml-vectors scripts/ggml-vectors.c -I$L/ggml/include
//      -L$L/build/bin -lggml-base -lggml-cpu -lggml -Wl,-rpath,$L/build/bin
//   /tmp/ggml-vectors ir/tests/data/ggml_vectors.bin TQ1_0 TQ2_0 IQ3_XXS IQ3_S IQ2_XXS \
//      IQ2_XS IQ2_S IQ1_S IQ1_M MXFP4 IQ4_NL

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "ggml.h"
#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"

static uint64_t rng_state;

// splitmix64 (the Rust test regenerates the mul_mat activations with the same generator).
static uint64_t next_u64(void) {
    rng_state += 0x9e3779b97f4a7c15ull;
    uint64_t z = rng_state;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

// Uniform in [-1, 1), exactly representable.
static float unit(void) {
    return (float) (next_u64() >> 40) / (float) (1u << 24) * 2.0f - 1.0f;
}

static FILE * out;

static void put_u32(uint32_t v) { fwrite(&v, 4, 1, out); }
static void put_u64(uint64_t v) { fwrite(&v, 8, 1, out); }
static void put_bytes(const void * p, size_t n) { fwrite(p, 1, n, out); }

// Where a type keeps the scales random bytes must not fill (an f16 `d`, MXFP4's E8M0
// exponent), so that values stay finite and moderate.
struct scale_spec {
    const char * name;
    int f16_offsets[2];  // -1 when unused
    int e8m0_offset;     // -1 when unused
};

static const struct scale_spec specs[] = {
    {"TQ1_0", {52, -1}, -1},  {"TQ2_0", {64, -1}, -1},   {"IQ2_XXS", {0, -1}, -1},
    {"IQ2_XS", {0, -1}, -1},  {"IQ2_S", {0, -1}, -1},    {"IQ3_XXS", {0, -1}, -1},
    {"IQ3_S", {0, -1}, -1},   {"IQ1_S", {0, -1}, -1},    {"IQ1_M", {-1, -1}, -1},
    {"MXFP4", {-1, -1}, 0},   {"IQ4_NL", {0, -1}, -1},   {"Q4_0", {0, -1}, -1},
};

static void random_weights(enum ggml_type t, const struct scale_spec * s, uint8_t * p, size_t nb) {
    const size_t ts = ggml_type_size(t);
    for (size_t i = 0; i < nb * ts; i++) p[i] = (uint8_t) next_u64();
    for (size_t b = 0; b < nb; b++) {
        uint8_t * blk = p + b * ts;
        for (int j = 0; j < 2; j++) {
            if (s->f16_offsets[j] < 0) continue;
            float v = (float) (next_u64() % 1000) / 20000.0f + 1e-3f;
            if (next_u64() % 5 == 0) v = -v;
            ggml_fp16_t h = ggml_fp32_to_fp16(v);
            memcpy(blk + s->f16_offsets[j], &h, 2);
        }
        if (s->e8m0_offset >= 0) blk[s->e8m0_offset] = (uint8_t) (118 + next_u64() % 12);
        if (t == GGML_TYPE_IQ1_M) {
            // The f16 d is spread over the top nibbles of the four u16 scales (bytes 48..56).
            float v = (float) (next_u64() % 1000) / 20000.0f + 1e-3f;
            ggml_fp16_t h = ggml_fp32_to_fp16(v);
            uint16_t sc[4];
            memcpy(sc, blk + 48, 8);
            for (int j = 0; j < 4; j++) sc[j] = (uint16_t) ((sc[j] & 0x0fff) | (((h >> (4 * j)) & 0xf) << 12));
            memcpy(blk + 48, sc, 8);
        }
    }
}

// Raw random activation blocks with a moderate scale (Q8_K: f32 d; Q8_0: f16 d).
static void raw_acts(enum ggml_type at, uint8_t * p, size_t nb) {
    const size_t ts = ggml_type_size(at);
    for (size_t i = 0; i < nb * ts; i++) p[i] = (uint8_t) next_u64();
    for (size_t b = 0; b < nb; b++) {
        float d = (float) (next_u64() % 1000) / 50000.0f + 1e-4f;
        if (at == GGML_TYPE_Q8_K) {
            memcpy(p + b * ts, &d, 4);
        } else {
            ggml_fp16_t h = ggml_fp32_to_fp16(d);
            memcpy(p + b * ts, &h, 2);
        }
    }
}

static void mul_mat(enum ggml_type t, const struct scale_spec * s, int k, int m, int n) {
    const uint64_t seed = next_u64();
    struct ggml_init_params ip = {64u << 20, NULL, false};
    struct ggml_context * ctx = ggml_init(ip);
    struct ggml_tensor * w = ggml_new_tensor_2d(ctx, t, k, m);
    struct ggml_tensor * x = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, k, n);
    const size_t nb = (size_t) k / ggml_blck_size(t) * m;
    random_weights(t, s, (uint8_t *) w->data, nb);
    const uint64_t saved = rng_state;
    rng_state = seed;
    for (int i = 0; i < k * n; i++) ((float *) x->data)[i] = unit();
    rng_state = saved;
    struct ggml_tensor * y = ggml_mul_mat(ctx, w, x);
    struct ggml_cgraph * g = ggml_new_graph(ctx);
    ggml_build_forward_expand(g, y);
    ggml_graph_compute_with_ctx(ctx, g, 1);
    put_u32(3);
    put_u32((uint32_t) t);
    put_u32((uint32_t) k);
    put_u32((uint32_t) m);
    put_u32((uint32_t) n);
    put_u64(seed);
    put_bytes(w->data, ggml_nbytes(w));
    put_bytes(y->data, sizeof(float) * (size_t) m * n);
    ggml_free(ctx);
}

// The CPU backend's extra buffer type that repacks weights at upload (`CPU_REPACK`).
static ggml_backend_buffer_type_t repack_buft(void) {
    ggml_backend_dev_t dev = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
    if (!dev) return NULL;
    ggml_backend_reg_t reg = ggml_backend_dev_backend_reg(dev);
    ggml_backend_dev_get_extra_bufts_t get =
        (ggml_backend_dev_get_extra_bufts_t) ggml_backend_reg_get_proc_address(reg, "ggml_backend_dev_get_extra_bufts");
    if (!get) return NULL;
    for (ggml_backend_buffer_type_t * b = get(dev); b && *b; b++)
        if (strcmp(ggml_backend_buft_name(*b), "CPU_REPACK") == 0) return *b;
    return NULL;
}

// mul_mat as llama.cpp runs it for a model weight: the weight uploaded into CPU_REPACK
// (interleaved there when its type and rows qualify), the product computed by the CPU
// backend on one thread. Record kind 4, laid out as kind 3.
static int mul_mat_repacked(enum ggml_type t, const struct scale_spec * s, int k, int m, int n) {
    ggml_backend_buffer_type_t buft = repack_buft();
    if (!buft) {
        fprintf(stderr, "no CPU_REPACK buffer type\n");
        return 1;
    }
    const uint64_t seed = next_u64();
    struct ggml_init_params wp = {ggml_tensor_overhead() * 2, NULL, true};
    struct ggml_context * wctx = ggml_init(wp);
    struct ggml_tensor * w = ggml_new_tensor_2d(wctx, t, k, m);
    ggml_backend_buffer_t wbuf = ggml_backend_alloc_ctx_tensors_from_buft(wctx, buft);
    const size_t nb = (size_t) k / ggml_blck_size(t) * m;
    uint8_t * wdata = malloc(ggml_nbytes(w));
    random_weights(t, s, wdata, nb);
    ggml_backend_tensor_set(w, wdata, 0, ggml_nbytes(w));

    struct ggml_init_params ip = {ggml_tensor_overhead() * 8 + ggml_graph_overhead(), NULL, true};
    struct ggml_context * ctx = ggml_init(ip);
    struct ggml_tensor * x = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, k, n);
    struct ggml_tensor * y = ggml_mul_mat(ctx, w, x);
    struct ggml_cgraph * g = ggml_new_graph(ctx);
    ggml_build_forward_expand(g, y);
    ggml_backend_t cpu = ggml_backend_cpu_init();
    ggml_backend_cpu_set_n_threads(cpu, 1);
    ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors(ctx, cpu);
    float * xf = malloc(sizeof(float) * (size_t) k * n);
    const uint64_t saved = rng_state;
    rng_state = seed;
    for (int i = 0; i < k * n; i++) xf[i] = unit();
    rng_state = saved;
    ggml_backend_tensor_set(x, xf, 0, sizeof(float) * (size_t) k * n);
    ggml_backend_graph_compute(cpu, g);
    float * yf = malloc(sizeof(float) * (size_t) m * n);
    ggml_backend_tensor_get(y, yf, 0, sizeof(float) * (size_t) m * n);
    put_u32(4);
    put_u32((uint32_t) t);
    put_u32((uint32_t) k);
    put_u32((uint32_t) m);
    put_u32((uint32_t) n);
    put_u64(seed);
    put_bytes(wdata, ggml_nbytes(w));
    put_bytes(yf, sizeof(float) * (size_t) m * n);
    free(wdata);
    free(xf);
    free(yf);
    ggml_backend_buffer_free(buf);
    ggml_backend_free(cpu);
    ggml_free(ctx);
    ggml_backend_buffer_free(wbuf);
    ggml_free(wctx);
    return 0;
}

int main(int argc, char ** argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s OUT.bin TYPE...\n", argv[0]);
        return 2;
    }
    ggml_cpu_init();
    out = fopen(argv[1], "wb");
    if (!out) {
        perror(argv[1]);
        return 1;
    }
    put_bytes("MCGV", 4);
    put_u32(1);
    for (int a = 2; a < argc; a++) {
        const struct scale_spec * s = NULL;
        for (size_t i = 0; i < sizeof(specs) / sizeof(specs[0]); i++)
            if (strcmp(specs[i].name, argv[a]) == 0) s = &specs[i];
        enum ggml_type t = GGML_TYPE_COUNT;
        for (int i = 0; i < GGML_TYPE_COUNT; i++) {
            const char * nm = ggml_type_name((enum ggml_type) i);
            if (nm && strcasecmp(nm, argv[a]) == 0) t = (enum ggml_type) i;
        }
        if (!s || t == GGML_TYPE_COUNT) {
            fprintf(stderr, "unknown type %s\n", argv[a]);
            return 2;
        }
        rng_state = 0x5eed0000ull + (uint64_t) t;
        const size_t ts = ggml_type_size(t);
        const int bs = (int) ggml_blck_size(t);
        const struct ggml_type_traits_cpu * cpu = ggml_get_type_traits_cpu(t);
        const enum ggml_type at = cpu->vec_dot_type;
        const size_t ats = ggml_type_size(at);
        const int abs_ = (int) ggml_blck_size(at);

        // 1: dequantization of 2 blocks.
        {
            const size_t nb = 2;
            uint8_t * w = malloc(nb * ts);
            float * y = malloc(sizeof(float) * nb * bs);
            random_weights(t, s, w, nb);
            ggml_get_type_traits(t)->to_float(w, y, (int64_t) nb * bs);
            put_u32(1);
            put_u32((uint32_t) t);
            put_u32((uint32_t) nb);
            put_bytes(w, nb * ts);
            put_bytes(y, sizeof(float) * nb * bs);
            free(w);
            free(y);
        }
        // 2: vec_dot of 2-block rows: quantized activations (flag 0) and raw ones (flag 1).
        for (int c = 0; c < 8; c++) {
            const int nb = 1 + c % 2;
            const int n = nb * bs;
            const size_t anb = (size_t) n / abs_;
            uint8_t * w = malloc(nb * ts);
            uint8_t * act = malloc(anb * ats);
            float * xf = malloc(sizeof(float) * n);
            random_weights(t, s, w, nb);
            const int raw = c >= 4;
            if (raw) {
                raw_acts(at, act, anb);
            } else {
                for (int i = 0; i < n; i++) xf[i] = unit();
                ggml_get_type_traits_cpu(at)->from_float(xf, act, n);
            }
            float r = 0;
            cpu->vec_dot(n, &r, 0, w, 0, act, 0, 1);
            put_u32(2);
            put_u32((uint32_t) t);
            put_u32((uint32_t) nb);
            put_u32((uint32_t) raw);
            put_bytes(w, nb * ts);
            put_bytes(act, anb * ats);
            put_bytes(&r, 4);
            free(w);
            free(act);
            free(xf);
        }
        // 3: mul_mat with 1 and 9 columns.
        mul_mat(t, s, 2 * 256, 4, 1);
        mul_mat(t, s, 2 * 256, 4, 9);
        if (bs == 32) {
            // 4: vec_dot of 3-block rows (a pair, then the scalar tail), quantized activations.
            for (int c = 0; c < 2; c++) {
                const int nb3 = 3, n = nb3 * bs;
                const size_t anb = (size_t) n / abs_;
                uint8_t * w = malloc(nb3 * ts);
                uint8_t * act = malloc(anb * ats);
                float * xf = malloc(sizeof(float) * n);
                random_weights(t, s, w, nb3);
                for (int i = 0; i < n; i++) xf[i] = unit();
                ggml_get_type_traits_cpu(at)->from_float(xf, act, n);
                float r = 0;
                cpu->vec_dot(n, &r, 0, w, 0, act, 0, 1);
                put_u32(2);
                put_u32((uint32_t) t);
                put_u32((uint32_t) nb3);
                put_u32(0);
                put_bytes(w, nb3 * ts);
                put_bytes(act, anb * ats);
                put_bytes(&r, 4);
                free(w);
                free(act);
                free(xf);
            }
        }
        if (t == GGML_TYPE_Q4_0 || t == GGML_TYPE_IQ4_NL || t == GGML_TYPE_MXFP4) {
            // 5: the repacked kernels: gemv (1 column), gemm for 8 columns + gemv for 1.
            if (mul_mat_repacked(t, s, 3 * 64, 16, 1) || mul_mat_repacked(t, s, 3 * 64, 16, 9)) return 1;
        }
    }
    put_u32(0);
    fclose(out);
    return 0;
}
