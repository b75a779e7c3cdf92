// CUDA dialect of modelc's generated kernels: the kernel bodies are written in a small
// vocabulary (this block) that the Metal prelude defines in MSL terms, so one printer
// serves both targets. See codegen-cuda/src/lib.rs for the list.
#include <cuda_fp16.h>

typedef unsigned char u8;
typedef signed char i8;
typedef unsigned short u16;
typedef short i16;
typedef unsigned int u32;
typedef int i32;
typedef unsigned long long u64;
typedef long long i64;

// The byte offsets of a kernel's operands in their buffers (codegen_cuda::Launch::operands).
struct Operands {
    u64 at[16];
};

// A kernel of `nt` threads per block over the three buffers of the ABI and its operands.
#define KERNEL(name, nt) \
    extern "C" __global__ void __launch_bounds__(nt) \
    name(u8* __restrict__ arena, u8* __restrict__ kv, const u8* __restrict__ wts, const Operands ops)
// A helper function.
#define FN static __device__ __forceinline__
// Address space of pointers into the three buffers (none in CUDA).
#define GMEM
// Storage of an array shared by the threads of a block.
#define SHARED __shared__
// A read-only table at file scope, in global memory (read through the L1 cache) rather than
// __constant__: the lanes of a warp read a lookup table at different entries, and the
// constant cache serves a warp's distinct addresses one after another. (ggml's CUDA backend
// keeps its tables in global memory too; this also leaves the 64 KiB of __constant__ free.)
#define CONSTANT static __device__ const
#define TX ((i32)threadIdx.x)
#define BX ((i32)blockIdx.x)
#define BY ((i32)blockIdx.y)
#define BZ ((i32)blockIdx.z)
#define SYNC() __syncthreads()
#define SHFL_XOR(v, m) __shfl_xor_sync(0xffffffffu, (v), (m))
#define F16_TO_F32(u) __half2float(__ushort_as_half((u16)(u)))
#define F32_TO_F16(f) __half_as_ushort(__float2half_rn(f))
#define BF16_TO_F32(u) __uint_as_float(((u32)(u)) << 16)
#define AS_FLOAT(u) __uint_as_float(u)
#define AS_UINT(f) __float_as_uint(f)
#define UNROLL _Pragma("unroll")
