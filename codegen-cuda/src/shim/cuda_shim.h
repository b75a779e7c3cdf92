// modelc CPU shim, CUDA dialect: what a generated CUDA source uses of CUDA, in host C++
// (g++ -std=c++20), so that the source compiles unchanged and runner.cpp runs its kernels.
#pragma once
#include <cmath>

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
