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

// Tensor cores (Target::tensor_cores; sm_80 and later). Kernels printed for a target with
// them may use these two words; the CPU shim (cuda_shim.h) defines both for itself.
#ifndef MODELC_CPU_SHIM
// `f` rounded to TF32 (10 mantissa bits, f32's range; nearest, ties away from zero), as a
// float whose low 13 bits are zero: `cvt.rna.tf32.f32`.
FN float TO_TF32(float f) {
    u32 r;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(f));
    return __uint_as_float(r);
}
// d += A·B for one warp: A a 16×8 TF32 tile (row-major), B 8×8 (column-major), d the 16×8
// f32 accumulator (PTX ISA, "mma.m16n8k8", .tf32 fragments). With g = lane / 4 and
// t = lane % 4, a lane holds a = {A[g][t], A[g+8][t], A[g][t+4], A[g+8][t+4]},
// b = {B[t][g], B[t+4][g]} and d = {D[g][2t], D[g][2t+1], D[g+8][2t], D[g+8][2t+1]}.
#define MMA_TF32(d, a, b)                                                                   \
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 "                      \
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"          \
                 : "+f"((d)[0]), "+f"((d)[1]), "+f"((d)[2]), "+f"((d)[3])                    \
                 : "r"(AS_UINT((a)[0])), "r"(AS_UINT((a)[1])), "r"(AS_UINT((a)[2])),         \
                   "r"(AS_UINT((a)[3])), "r"(AS_UINT((b)[0])), "r"(AS_UINT((b)[1])))
#endif
