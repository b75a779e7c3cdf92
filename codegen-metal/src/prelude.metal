// Metal dialect of modelc's generated kernels: the same kernel bodies as the CUDA target,
// written in a small vocabulary that this block defines in MSL terms.
#include <metal_stdlib>
using namespace metal;

typedef uchar u8;
typedef char i8;
typedef ushort u16;
typedef short i16;
typedef uint u32;
typedef int i32;
typedef ulong u64;
typedef long i64;

// The byte offsets of a kernel's operands in their buffers (codegen_cuda::Launch::operands).
struct Operands {
    u64 at[16];
};

// A kernel over the three buffers of the ABI and its operands; `nt` threads per threadgroup
// (the dispatch table gives it; Metal takes the size at dispatch).
#define KERNEL(name, nt) \
    kernel void name(device u8* arena [[buffer(0)]], device u8* kv [[buffer(1)]], \
                     device const u8* wts [[buffer(2)]], constant Operands& ops [[buffer(3)]], \
                     uint3 tg_pos_ [[threadgroup_position_in_grid]], \
                     uint t_idx_ [[thread_index_in_threadgroup]])
#define FN static inline
#define GMEM device
#define SHARED threadgroup
#define CONSTANT constant
#define TX ((i32)t_idx_)
#define BX ((i32)tg_pos_.x)
#define BY ((i32)tg_pos_.y)
#define BZ ((i32)tg_pos_.z)
#define SYNC() threadgroup_barrier(mem_flags::mem_threadgroup)
#define SHFL_XOR(v, m) simd_shuffle_xor((v), (ushort)(m))
#define F16_TO_F32(u) ((float)as_type<half>((u16)(u)))
#define F32_TO_F16(f) as_type<u16>((half)(f))
#define BF16_TO_F32(u) as_type<float>(((u32)(u)) << 16)
#define AS_FLOAT(u) as_type<float>(u)
#define AS_UINT(f) as_type<u32>(f)
#define UNROLL _Pragma("unroll")
#define expf exp
#define logf log
#define tanhf tanh
#define sqrtf sqrt
#define fabsf fabs
#define fmaxf fmax
#define fminf fmin
#define roundf round
#define floorf floor
#define cosf cos
#define sinf sin
#define powf pow
