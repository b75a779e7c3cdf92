// modelc CPU shim, Metal dialect: what a generated Metal source uses of the Metal Shading
// Language, in host C++ (g++ -std=c++20 -Wno-attributes), so that the source compiles
// unchanged and runner.cpp runs its kernels. No standard header is included: the float math
// lives in namespace metal only (the source says `using namespace metal;`), so an unqualified
// `exp(x)` finds Metal's overloads and nothing else.
#pragma once
#include "shim_abi.h"

typedef unsigned char uchar;
typedef unsigned short ushort;
typedef unsigned int uint;
typedef unsigned long ulong;
typedef _Float16 half;

struct uint3 {
    uint x, y, z;
};

// Address spaces: a pointer's is meaningless on the CPU; codegen_metal::lint checks that
// every pointer has one. Threadgroup variables are the block's shared memory.
#define kernel
#define device
#define constant const
#define thread
#define threadgroup SHIM_SHARED_STORAGE

namespace metal {

enum class mem_flags { mem_none = 0, mem_device = 1, mem_threadgroup = 2, mem_texture = 4 };

static inline void threadgroup_barrier(mem_flags) { shim_sync_block(); }

template <class T>
static inline T simd_shuffle_xor(T v, ushort m) {
    return shim_shfl_xor_t(v, (int)m);
}

template <class T, class U>
static inline T as_type(U x) {
    static_assert(sizeof(T) == sizeof(U), "as_type: sizes differ");
    return __builtin_bit_cast(T, x);
}

static inline float exp(float x) { return __builtin_expf(x); }
static inline float log(float x) { return __builtin_logf(x); }
static inline float tanh(float x) { return __builtin_tanhf(x); }
static inline float sqrt(float x) { return __builtin_sqrtf(x); }
static inline float fabs(float x) { return __builtin_fabsf(x); }
static inline float fmax(float x, float y) { return __builtin_fmaxf(x, y); }
static inline float fmin(float x, float y) { return __builtin_fminf(x, y); }
static inline float round(float x) { return __builtin_roundf(x); }
static inline float floor(float x) { return __builtin_floorf(x); }
static inline float cos(float x) { return __builtin_cosf(x); }
static inline float sin(float x) { return __builtin_sinf(x); }
static inline float pow(float x, float y) { return __builtin_powf(x, y); }

}  // namespace metal
