//! Kernels generated with Cranelift: each generator emits one function for one fixed shape
//! (shapes are constants in the code), JIT-compiled for the host by [`crate::jit::Jit`].
//!
//! - `quant`: Q4_0 / Q4_1 / Q8_0 weights × 8-bit activations (integer dot products) in
//!   llama.cpp's x86 AVX2 order ([`SumOrder::Ggml`]);
//! - `quant_block`: the same products in ggml's scalar block order ([`SumOrder::Block`]);
//! - `float`: F32 / F16 / BF16 weights (stored as f32) × f32 activations;
//! - `emit`: the helpers every generator writes its IR with.
//!
//! Only the matmuls are generated. Their activations are prepared by hand-written code
//! ([`crate::handwritten`]'s `actq`), and every other kernel of a plan is hand-written too
//! (the table in the crate doc says where each kernel comes from).
//!
//! The quantized generators' one x86-specific Cranelift instruction (`x86_pmaddubsw`) has a
//! portable form of the same values ([`emit::Emit::pmaddubsw`]), so every kernel is generated
//! for x86-64 and aarch64 alike ([`crate::jit::host_isa`]).
//!
//! Every matmul kernel has the same signature, `KernelFn`, in the host's C calling
//! convention (see [`crate::jit::Jit::call_conv`]):
//!
//! ```text
//! fn(w: *const u8, act: *const u8, out: *mut f32, g_begin: i64, g_end: i64)
//! ```
//!
//! `w` is a [`crate::layout::RepackedWeight`]'s data, `act` the prepared activations (see
//! [`crate::actq`] for quantized formats; f32 rows for float formats), `out` the `{M, N}`
//! f32 result; the call computes the rows of the 4-row groups `g_begin..g_end` for all `N`
//! tokens.

pub(crate) mod emit;
pub(crate) mod float;
pub(crate) mod quant;
pub(crate) mod quant_block;

use cranelift_codegen::ir::types::I64;
use cranelift_codegen::ir::Function;
use cranelift_codegen::ir::UserFuncName;
use cranelift_frontend::{FunctionBuilder, FunctionBuilderContext};

use crate::jit::Jit;
use emit::Emit;

/// The entry of a generated matmul kernel: `(w, act, out, g_begin, g_end)` (module doc).
///
/// `extern "C"` is the host's C calling convention, and [`Jit::signature`] gives every
/// generated function [`Jit::call_conv`], Cranelift's default convention for the host
/// triple, which is that same convention (System V on x86-64 Linux and macOS, Windows
/// fastcall on x86-64 Windows, AAPCS64 / Apple's variant on aarch64). [`Jit::new`] checks
/// the two agree (`jit::c_call_conv`), so transmuting a kernel's address to this type is
/// sound on every host the JIT accepts.
pub(crate) type KernelFn = unsafe extern "C" fn(*const u8, *const u8, *mut f32, i64, i64);

/// Register/loop blocking of a matmul kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tiling {
    /// Tokens (columns of the activation) computed together, reusing each decoded weight
    /// block from registers (quantized kernels: rounded to 1, 2 or 4). The last tile of `N`
    /// may be smaller.
    pub tokens: usize,
    /// Blocks (of 32 values, or `k` steps for float kernels) per loop iteration.
    pub unroll: usize,
    /// Groups of 4 rows computed together, sharing each activation load. Used only by the
    /// [`SumOrder::Block`] quantized kernels: the [`SumOrder::Ggml`] ones compute one group
    /// at a time (their eight lane accumulators per group fill the registers), float
    /// kernels too.
    pub groups: usize,
    /// The order quantized kernels add their f32 partial sums in (float kernels ignore it).
    pub order: SumOrder,
}

/// How a quantized matmul kernel adds up its per-block f32 terms. The integer sums inside a
/// block are exact either way; only the f32 rounding differs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum SumOrder {
    /// llama.cpp's x86 AVX2 order, bit for bit (`ggml_vec_dot_q4_1_q8_1` and friends in
    /// ggml-cpu/arch/x86/quants.c): eight lane accumulators per row, one fused multiply-add
    /// per lane and block, ggml's `hsum_float_8` at the end (module `quant`). The default:
    /// the same logits as llama.cpp.
    #[default]
    Ggml,
    /// One f32 fused multiply-add per row and block of the block's exact integer sum (ggml's
    /// scalar order, module `quant_block`): about 1.4× less vector work per weight byte, so
    /// faster decode, but last-bit differences from llama.cpp that 8-bit activation rounding
    /// amplifies (on SmolLM2 Q4_1 up to 0.6 nat in teacher-forced log-probabilities).
    Block,
}

/// The arguments every matmul kernel receives (see the module doc).
pub(crate) struct KernelArgs {
    pub w: cranelift_codegen::ir::Value,
    pub act: cranelift_codegen::ir::Value,
    pub out: cranelift_codegen::ir::Value,
    pub g_begin: cranelift_codegen::ir::Value,
    pub g_end: cranelift_codegen::ir::Value,
}

/// Builds a function with the matmul kernel signature, lets `body` emit it, and returns it.
pub(crate) fn build_matmul_fn(jit: &Jit, body: impl FnOnce(&mut Emit, &KernelArgs)) -> Function {
    let ptr = jit.pointer_type();
    let sig = jit.signature(&[ptr, ptr, ptr, I64, I64]);
    let mut func = Function::with_name_signature(UserFuncName::default(), sig);
    let mut fctx = FunctionBuilderContext::new();
    {
        let fb = FunctionBuilder::new(&mut func, &mut fctx);
        let mut e = Emit::new(fb, jit.is_x86());
        let entry = e.fb.create_block();
        e.fb.append_block_params_for_function_params(entry);
        e.fb.switch_to_block(entry);
        e.fb.seal_block(entry);
        let p = e.fb.block_params(entry).to_vec();
        let args = KernelArgs {
            w: p[0],
            act: p[1],
            out: p[2],
            g_begin: p[3],
            g_end: p[4],
        };
        body(&mut e, &args);
        e.ret();
        e.fb.finalize(jit.frontend_config());
    }
    func
}
