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
// A read-only table at file scope, in the 64 KiB __constant__ bank (all of ggml's lookup
// tables together take 34 KiB). Not global memory, where ggml's CUDA backend keeps them:
// there each table's address takes registers, and ptxas spilled in the fused matrix
// products of the IQ types (8 to 16 bytes of stack). The price: the constant cache serves
// the distinct entries a warp's lanes read one after another (not measured on a GPU yet).
#define CONSTANT static __constant__
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
