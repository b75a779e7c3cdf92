// modelc CPU shim: stands in for CUDA's <cuda_fp16.h> (found first through -I).
#pragma once
#include "cuda_shim.h"

// IEEE binary16; conversions from float round to nearest even, like __float2half_rn.
struct __half {
    _Float16 v;
};
static inline float __half2float(__half h) { return (float)h.v; }
static inline __half __float2half_rn(float f) { return __half{(_Float16)f}; }
static inline __half __float2half(float f) { return __half{(_Float16)f}; }
static inline __half __ushort_as_half(unsigned short u) {
    return __half{__builtin_bit_cast(_Float16, u)};
}
static inline unsigned short __half_as_ushort(__half h) {
    return __builtin_bit_cast(unsigned short, h.v);
}
