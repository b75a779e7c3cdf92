//! Small helpers over Cranelift's `FunctionBuilder` used by every kernel generator: typed
//! loads with constant offsets, vector constants, broadcasts, and counted loops whose body is
//! emitted once (the generators keep loop bodies small: measured faster than full unrolling).
//!
//! The x86-64 instruction each helper is meant to become is named in its doc: with
//! `opt_level = "none"` Cranelift lowers the IR one pattern at a time, in the order it is
//! emitted, so the generators write IR in the order the instructions should issue.
//!
//! Two facts of Cranelift 0.135's x86-64 lowering shape the kernels:
//! - a load is folded into the instruction using it (a memory operand, or `vbroadcastss m32`
//!   for a splat) only if the loaded value is used once *transitively*: when any value
//!   computed from it is used twice — `pmaddwd` uses its input twice, a loop-carried sum is
//!   used on both edges of the loop branch — the load becomes its own instruction. So data
//!   the kernels would broadcast is stored pre-broadcast (a plain load is one instruction,
//!   an unfolded broadcast three);
//! - a `vconst` is never folded; constants are made once per function and stay in registers.

use cranelift_codegen::ir::condcodes::IntCC;
use cranelift_codegen::ir::types::{F32, F32X4, I16X8, I32X4, I64, I8X16};
use cranelift_codegen::ir::{InstBuilder, MemFlagsData, Type, Value};
use cranelift_frontend::{FunctionBuilder, Variable};

/// A function being emitted, with the memory flags every kernel load uses.
pub(crate) struct Emit<'a> {
    /// The Cranelift builder.
    pub fb: FunctionBuilder<'a>,
    flags: MemFlagsData,
    /// Whether the function is for x86-64, whose SSSE3 `pmaddubsw` Cranelift exposes as its
    /// own instruction ([`Emit::pmaddubsw`]); other targets get the same numbers from
    /// Cranelift's portable vector instructions.
    x86: bool,
}

impl<'a> Emit<'a> {
    /// Wraps a builder for a function of the target `x86` says (x86-64 or not). Loads are
    /// `notrap` (callers check every buffer size before a call) and not marked aligned.
    pub fn new(fb: FunctionBuilder<'a>, x86: bool) -> Emit<'a> {
        Emit {
            fb,
            flags: MemFlagsData::new().with_notrap(),
            x86,
        }
    }

    /// `load ty [p + off]`.
    pub fn load(&mut self, ty: Type, p: Value, off: usize) -> Value {
        let off = off_i32(off);
        self.fb.ins().load(ty, self.flags, p, off)
    }

    /// `store [p + off], v`.
    pub fn store(&mut self, v: Value, p: Value, off: usize) {
        let off = off_i32(off);
        self.fb.ins().store(self.flags, v, p, off);
    }

    /// `n` (1..=4) f32 values from `[p + off]` into the low lanes of an f32x4 (the others 0),
    /// without reading past them.
    pub fn load_partial_f32(&mut self, p: Value, off: usize, n: usize) -> Value {
        let mut v = self.zero(F32X4);
        for i in 0..n.min(4) {
            let x = self.load(F32, p, off + 4 * i);
            v = self.fb.ins().insertlane(v, x, i as u8);
        }
        v
    }

    /// Lane `lane` (0..4) of a 32-bit-lane vector copied to all four lanes (`pshufd`).
    pub fn lane_broadcast32(&mut self, v: Value, lane: usize) -> Value {
        let ty = self.fb.func.dfg.value_type(v);
        let b = self.bitcast(I8X16, v);
        let mut mask = [0u8; 16];
        for (i, m) in mask.iter_mut().enumerate() {
            *m = (4 * lane + i % 4) as u8;
        }
        let imm = self.fb.func.dfg.immediates.push(mask.to_vec().into());
        let r = self.fb.ins().shuffle(b, b, imm);
        self.bitcast(ty, r)
    }

    /// Four f16 values at `[p + off]` converted exactly to f32x4 (finite inputs only:
    /// infinities and NaNs come out as large finite numbers). `c` holds the two constants.
    ///
    /// `pmovsxwd` sign-extends each f16 to 32 bits; shifting left by 13 puts exponent and
    /// mantissa where f32 keeps them and a copy of the sign in bit 31; masking with
    /// `0x8fffe000` clears the other sign copies. Read as f32 that is the value × 2^-112
    /// (f16 subnormals become f32 subnormals), so one multiply by 2^112 finishes, exactly.
    pub fn f16x4_to_f32x4(&mut self, p: Value, off: usize, c: &F16Consts) -> Value {
        let off = off_i32(off);
        let h = self.fb.ins().sload16x4(self.flags, p, off);
        let x = self.fb.ins().ishl_imm_u(h, 13);
        let x = self.fb.ins().band(x, c.mask);
        let f = self.bitcast(F32X4, x);
        self.fb.ins().fmul(f, c.scale)
    }

    /// Four bf16 values at `[p + off]` converted to f32x4 (`pmovzxwd`, shift left by 16).
    pub fn bf16x4_to_f32x4(&mut self, p: Value, off: usize) -> Value {
        let off = off_i32(off);
        let h = self.fb.ins().uload16x4(self.flags, p, off);
        let x = self.fb.ins().ishl_imm_u(h, 16);
        self.bitcast(F32X4, x)
    }

    /// The constants of [`Emit::f16x4_to_f32x4`], materialized once per function.
    pub fn f16_consts(&mut self) -> F16Consts {
        let mut mask = [0u8; 16];
        let mut scale = [0u8; 16];
        for i in 0..4 {
            mask[4 * i..4 * i + 4].copy_from_slice(&0x8fff_e000u32.to_le_bytes());
            scale[4 * i..4 * i + 4].copy_from_slice(&(2.0f32).powi(112).to_le_bytes());
        }
        F16Consts {
            mask: self.vconst(I32X4, mask),
            scale: self.vconst(F32X4, scale),
        }
    }

    /// Lane reinterpretation between vector types (no instruction).
    pub fn bitcast(&mut self, ty: Type, v: Value) -> Value {
        if self.fb.func.dfg.value_type(v) == ty {
            return v;
        }
        let flags = MemFlagsData::new().with_endianness(cranelift_codegen::ir::Endianness::Little);
        self.fb.ins().bitcast(ty, flags, v)
    }

    /// A 128-bit constant with every byte equal to `b`.
    pub fn splat_u8_const(&mut self, b: u8) -> Value {
        self.vconst(I8X16, [b; 16])
    }

    /// A 128-bit constant of type `ty` from its little-endian bytes (a RIP-relative load).
    pub fn vconst(&mut self, ty: Type, bytes: [u8; 16]) -> Value {
        let c = self.fb.func.dfg.constants.insert(bytes.to_vec().into());
        self.fb.ins().vconst(ty, c)
    }

    /// A zero vector of type `ty` (`pxor`).
    pub fn zero(&mut self, ty: Type) -> Value {
        self.vconst(ty, [0; 16])
    }

    /// `pmaddubsw`: `signed` (i8x16) × `unsigned` (u8x16), adjacent products added with
    /// signed saturation into i16x8.
    ///
    /// On x86-64 it is the instruction itself. Elsewhere (aarch64: `smull`/`umull`-style
    /// widening, `addp`, `sqxtn`) the same values: each byte widened to i16 (the products,
    /// at most 128 · 255, fit), the products widened to i32 and added in adjacent pairs, and
    /// the i32 pair sums narrowed back to i16 with signed saturation, as `pmaddubsw` saturates.
    pub fn pmaddubsw(&mut self, signed: Value, unsigned: Value) -> Value {
        let s = self.bitcast(I8X16, signed);
        let u = self.bitcast(I8X16, unsigned);
        if self.x86 {
            return self.fb.ins().x86_pmaddubsw(s, u);
        }
        let (s_lo, s_hi) = (self.fb.ins().swiden_low(s), self.fb.ins().swiden_high(s));
        let (u_lo, u_hi) = (self.fb.ins().uwiden_low(u), self.fb.ins().uwiden_high(u));
        let p_lo = self.fb.ins().imul(s_lo, u_lo); // i16x8: the products of bytes 0..8
        let p_hi = self.fb.ins().imul(s_hi, u_hi); // bytes 8..16
        let sum_lo = self.pair_sums_i32(p_lo);
        let sum_hi = self.pair_sums_i32(p_hi);
        self.fb.ins().snarrow(sum_lo, sum_hi)
    }

    /// The sums of adjacent i16 lanes of `p` as i32x4 (exact: no saturation).
    fn pair_sums_i32(&mut self, p: Value) -> Value {
        let lo = self.fb.ins().swiden_low(p);
        let hi = self.fb.ins().swiden_high(p);
        self.fb.ins().iadd_pairwise(lo, hi)
    }

    /// Sum of adjacent i16 lanes into i32x4 (`pmaddwd` with a vector of ones).
    pub fn hadd_i16_pairs(&mut self, v: Value) -> Value {
        let v = self.bitcast(I16X8, v);
        let lo = self.fb.ins().swiden_low(v);
        let hi = self.fb.ins().swiden_high(v);
        self.fb.ins().iadd_pairwise(lo, hi)
    }

    /// A new variable of type `ty` holding `init`.
    pub fn var(&mut self, ty: Type, init: Value) -> Variable {
        let v = self.fb.declare_var(ty);
        self.fb.def_var(v, init);
        v
    }

    /// Emits `body` as a do-while loop run `n >= 1` times (a compile-time count). The body
    /// gets the loop index as an `i64` value. Loop-carried state lives in variables.
    pub fn counted_loop(&mut self, n: usize, mut body: impl FnMut(&mut Emit<'a>, Value)) {
        debug_assert!(n >= 1);
        if n == 1 {
            let zero = self.fb.ins().iconst(I64, 0);
            body(self, zero);
            return;
        }
        let zero = self.fb.ins().iconst(I64, 0);
        let i_var = self.var(I64, zero);
        let head = self.fb.create_block();
        let exit = self.fb.create_block();
        self.fb.ins().jump(head, &[]);
        self.fb.switch_to_block(head);
        let i = self.fb.use_var(i_var);
        body(self, i);
        let i = self.fb.use_var(i_var);
        let next = self.fb.ins().iadd_imm_s(i, 1);
        self.fb.def_var(i_var, next);
        let more = self
            .fb
            .ins()
            .icmp_imm_s(IntCC::SignedLessThan, next, n as i64);
        self.fb.ins().brif(more, head, &[], exit, &[]);
        self.fb.seal_block(head);
        self.fb.switch_to_block(exit);
        self.fb.seal_block(exit);
    }

    /// Emits `body` for `i = begin, begin + step, ...` while `i + step <= end` (runtime `i64`
    /// bounds) and returns the first `i` not done, for a remainder loop.
    pub fn strided_loop(
        &mut self,
        begin: Value,
        end: Value,
        step: usize,
        mut body: impl FnMut(&mut Emit<'a>, Value),
    ) -> Value {
        let i_var = self.var(I64, begin);
        let head = self.fb.create_block();
        let exit = self.fb.create_block();
        let first_end = self.fb.ins().iadd_imm_s(begin, step as i64);
        let nonempty = self
            .fb
            .ins()
            .icmp(IntCC::SignedLessThanOrEqual, first_end, end);
        self.fb.ins().brif(nonempty, head, &[], exit, &[]);
        self.fb.switch_to_block(head);
        let i = self.fb.use_var(i_var);
        body(self, i);
        let i = self.fb.use_var(i_var);
        let next = self.fb.ins().iadd_imm_s(i, step as i64);
        self.fb.def_var(i_var, next);
        let next_end = self.fb.ins().iadd_imm_s(next, step as i64);
        let more = self
            .fb
            .ins()
            .icmp(IntCC::SignedLessThanOrEqual, next_end, end);
        self.fb.ins().brif(more, head, &[], exit, &[]);
        self.fb.seal_block(head);
        self.fb.switch_to_block(exit);
        self.fb.seal_block(exit);
        self.fb.use_var(i_var)
    }

    /// Emits `body` for each `i` in `[begin, end)` (runtime `i64` bounds; nothing when empty).
    pub fn range_loop(
        &mut self,
        begin: Value,
        end: Value,
        mut body: impl FnMut(&mut Emit<'a>, Value),
    ) {
        let i_var = self.var(I64, begin);
        let head = self.fb.create_block();
        let exit = self.fb.create_block();
        let nonempty = self.fb.ins().icmp(IntCC::SignedLessThan, begin, end);
        self.fb.ins().brif(nonempty, head, &[], exit, &[]);
        self.fb.switch_to_block(head);
        let i = self.fb.use_var(i_var);
        body(self, i);
        let i = self.fb.use_var(i_var);
        let next = self.fb.ins().iadd_imm_s(i, 1);
        self.fb.def_var(i_var, next);
        let more = self.fb.ins().icmp(IntCC::SignedLessThan, next, end);
        self.fb.ins().brif(more, head, &[], exit, &[]);
        self.fb.seal_block(head);
        self.fb.switch_to_block(exit);
        self.fb.seal_block(exit);
    }

    /// `p + i * stride` for an `i64` index.
    pub fn offset_ptr(&mut self, p: Value, i: Value, stride: usize) -> Value {
        let off = self.fb.ins().imul_imm_s(i, stride as i64);
        self.fb.ins().iadd(p, off)
    }

    /// Returns from the function (no results).
    pub fn ret(&mut self) {
        self.fb.ins().return_(&[]);
    }
}

/// Constants of the f16 → f32 conversion ([`Emit::f16_consts`]).
pub(crate) struct F16Consts {
    mask: Value,
    scale: Value,
}

/// A constant offset as Cranelift's `Offset32`. Kernel offsets are bounded by the shapes the
/// matmul spec accepts (checked in [`crate::matmul::MatmulSpec::validate`]).
fn off_i32(off: usize) -> i32 {
    i32::try_from(off).unwrap_or(i32::MAX)
}
