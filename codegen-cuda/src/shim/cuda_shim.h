// modelc CPU shim, CUDA dialect: what a generated CUDA source uses of CUDA, in host C++
// (g++ -std=c++20), so that the source compiles unchanged and runner.cpp runs its kernels.
#pragma once
#include <cmath>

// The prelude leaves the tensor-core words to the shim (below).
#define MODELC_CPU_SHIM 1

#include "shim_abi.h"

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline __attribute__((always_inline))
#define __launch_bounds__(...)
#define __shared__ SHIM_SHARED_STORAGE
#define __constant__

typedef shim_dim3 dim3;
#define threadIdx shim_thread_idx
#define blockIdx shim_block_idx
#define blockDim shim_block_dim
#define gridDim shim_grid_dim

static inline void __syncthreads(void) { shim_sync_block(); }

static inline float __shfl_xor_sync(unsigned, float v, int m) { return shim_shfl_xor_t(v, m); }
static inline int __shfl_xor_sync(unsigned, int v, int m) { return shim_shfl_xor_t(v, m); }
static inline unsigned __shfl_xor_sync(unsigned, unsigned v, int m) {
    return shim_shfl_xor_t(v, m);
}

static inline float __uint_as_float(unsigned u) { return __builtin_bit_cast(float, u); }
static inline unsigned __float_as_uint(float f) { return __builtin_bit_cast(unsigned, f); }
static inline float __int_as_float(int u) { return __builtin_bit_cast(float, u); }
static inline int __float_as_int(float f) { return __builtin_bit_cast(int, f); }

// The prelude's tensor-core words (prelude.cuh, Target::tensor_cores) on the CPU.
// TO_TF32: round to 10 mantissa bits, nearest, ties away from zero (cvt.rna.tf32.f32); an
// infinity or NaN only loses its low 13 bits.
static inline float TO_TF32(float f) {
    unsigned u = __builtin_bit_cast(unsigned, f);
    if ((u & 0x7f800000u) != 0x7f800000u) u += 0x1000u;
    return __builtin_bit_cast(float, u & 0xffffe000u);
}

// MMA_TF32(d, a, b): one warp's m16n8k8 product in mma.sync's fragment layout (see the
// prelude): every lane publishes its six input registers, then computes its four results
// from the whole tiles. Inputs are truncated to TF32 as the tensor cores read them; the
// sums are sequential fmaf, not the tensor cores' own order and rounding.
static inline void shim_mma_tf32(float* d, const float* a, const float* b) {
    unsigned A[4][32], B[2][32];
    for (int i = 0; i < 4; i++) shim_warp_all(__builtin_bit_cast(unsigned, a[i]), A[i]);
    for (int i = 0; i < 2; i++) shim_warp_all(__builtin_bit_cast(unsigned, b[i]), B[i]);
    const int lane = (int)(shim_thread_idx.x % 32), g = lane / 4, t = lane % 4;
    for (int e = 0; e < 4; e++) {
        const int row = g + 8 * (e / 2), col = 2 * t + e % 2;
        float s = d[e];
        for (int k = 0; k < 8; k++) {
            // A[row][k] is register (row >= 8) + 2 (k >= 4) of lane (row % 8) * 4 + k % 4;
            // B[k][col] register (k >= 4) of lane col * 4 + k % 4.
            const unsigned av = A[row / 8 + 2 * (k / 4)][(row % 8) * 4 + k % 4] & 0xffffe000u;
            const unsigned bv = B[k / 4][col * 4 + k % 4] & 0xffffe000u;
            s = __builtin_fmaf(__builtin_bit_cast(float, av), __builtin_bit_cast(float, bv), s);
        }
        d[e] = s;
    }
}
#define MMA_TF32(d, a, b) shim_mma_tf32((d), (a), (b))
