//! Matrix × matrix products with fixed shapes: the public face of the generated matmul
//! kernels.
//!
//! ggml convention (`ggml_mul_mat`): a weight `{K, M}` (M rows of K values) times
//! activations `{K, N}` (N tokens) gives `{M, N}` f32, `out[t·M + r] = Σ_k w[r][k] · x[t][k]`.
//! Quantized weights are multiplied with activations quantized to their 8-bit companion
//! format first, as ggml does, and every output element is the f32 value llama.cpp's x86
//! AVX2 kernels compute (`ggml_vec_dot_q4_0_q8_0`, `_q4_1_q8_1`, `_q8_0_q8_0`), bit for
//! bit: eight lane sums of exact integer products per block, each added with a fused
//! multiply-add scaled by `d_w·d_a`, then ggml's `hsum_float_8` (plus the separate `m_w·s_a`
//! sum for Q4_1); see [`crate::generated`]' `quant` module and [`ir::ggml::vec_dot_avx2`]. The
//! same order for every `n` (llama.cpp's tinyBLAS gives the same numbers for Q4_0 / Q8_0
//! batches). Float weights are summed in this crate's own order (within rounding of ggml's).
//! The products are generated code ([`crate::generated`]); the activation quantizer is the
//! hand-written one the executor uses ([`crate::handwritten`]).
//!
//! Use: [`repack`](crate::layout::repack) the weight once; [`compile_matmul`] a kernel per
//! shape; per call, [`MatmulKernel::prepare`] the activations (or
//! [`MatmulKernel::prepare_tokens`] per thread), then [`MatmulKernel::call`] (one thread,
//! any row range) or [`MatmulKernel::run`] (rows split over a [`ThreadPool`]). To put many
//! kernels in one JIT module (a whole plan), use [`define_matmul`] on one [`Jit`], finalize
//! it, and take each kernel with [`MatmulKernel::from_code`].
//!
//! Measured with `kernel-bench` on this project's machine (see `src/bin/kernel-bench.rs`).

use std::ops::Range;
use std::sync::Arc;

use half::{bf16, f16};
use ir::ggml::GgmlType;

use crate::actq::{act_quant, act_row_bytes, ACT_AUX_OFFSET, ACT_BLOCK_BYTES};
use crate::formats::{QuantFormat, GROUP_ROWS, QK};
use crate::generated::{self, build_matmul_fn, KernelFn, SumOrder, Tiling};
use crate::handwritten::actq::FastQuant;
use crate::jit::{CodegenError, Jit, JitCode, Result};
use crate::layout::{self, RepackedWeight};
use crate::pool::ThreadPool;

/// The fixed shape of one matmul kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MatmulSpec {
    /// Weight type (Q4_0, Q4_1, Q8_0, F32, F16, BF16).
    pub wtype: GgmlType,
    /// Values per row of the weight and per token of the activation (`ne[0]` of both).
    pub k: usize,
    /// Weight rows = output values per token (`ne[1]` of the weight).
    pub m: usize,
    /// Tokens (`ne[1]` of the activation): 1 for decode, the ubatch for prompt processing.
    pub n: usize,
}

/// Largest byte offset a kernel computes from a constant (Cranelift's `Offset32`).
const MAX_OFFSET: usize = i32::MAX as usize / 2;

impl MatmulSpec {
    /// Checks that a kernel can be generated for this shape.
    ///
    /// Errors: [`CodegenError::UnsupportedType`]; [`CodegenError::Shape`] when a dimension is
    /// zero, `k` is not a multiple of the block size, or the buffers are too large for the
    /// kernels' 32-bit constant offsets.
    pub fn validate(&self) -> Result<()> {
        if !layout::supports(self.wtype) {
            return Err(CodegenError::UnsupportedType(self.wtype.name()));
        }
        if self.k == 0 || self.m == 0 || self.n == 0 {
            return Err(CodegenError::Shape(format!("empty matmul {self}")));
        }
        if !self.k.is_multiple_of(self.wtype.block_size()) {
            return Err(CodegenError::Shape(format!(
                "{self}: k is not a multiple of the {} block size {}",
                self.wtype.name(),
                self.wtype.block_size()
            )));
        }
        let too_big = |x: Option<usize>| x.is_none_or(|v| v > MAX_OFFSET);
        // constant offsets: token rows of `out` and of the activations; up to 4 groups
        if too_big(self.m.checked_mul(self.n).and_then(|v| v.checked_mul(4)))
            || too_big(self.act_bytes_checked())
            || too_big(
                layout::group_bytes_checked(self.wtype, self.k).and_then(|g| g.checked_mul(4)),
            )
        {
            return Err(CodegenError::Shape(format!("{self}: buffers too large")));
        }
        Ok(())
    }

    fn act_bytes_checked(&self) -> Option<usize> {
        match QuantFormat::of(self.wtype) {
            Some(_) => (self.k / QK)
                .checked_mul(ACT_BLOCK_BYTES)?
                .checked_mul(self.n),
            None => self.k.checked_mul(4)?.checked_mul(self.n),
        }
    }

    /// Bytes of the prepared activations ([`MatmulKernel::prepare`]).
    pub fn act_bytes(&self) -> usize {
        self.act_bytes_checked().unwrap_or(usize::MAX)
    }

    /// The tiling used by [`compile_matmul`]: quantized kernels compute one group of 4 rows
    /// at a time, for one token at decode (`n = 1`, two blocks per loop iteration) and tiles
    /// of 2 tokens otherwise (one block per iteration; see the `quant` kernel module, and
    /// `kernel-bench --tiling` to measure others); float kernels stream the
    /// weights once at decode and reuse each weight vector for 4 tokens otherwise.
    ///
    /// Measured on this project's machine (float kernels): two groups at a time (sharing the
    /// activation loads) is ~10% faster while the weights are in cache, but 2.5× slower
    /// streaming them from DRAM (two interleaved streams 1.4 KiB apart defeat the hardware
    /// prefetcher), and decode streams from DRAM.
    pub fn default_tiling(&self) -> Tiling {
        self.tiling_for(SumOrder::Ggml)
    }

    /// The default tiling of kernels that add in `order`: for [`SumOrder::Block`] quantized
    /// kernels, one group of 4 rows for one token at decode (two blocks per iteration) and
    /// tiles of 4 tokens otherwise (their four accumulators per group and token leave room).
    pub fn tiling_for(&self, order: SumOrder) -> Tiling {
        let quant = QuantFormat::of(self.wtype).is_some();
        let (tokens, unroll, groups) = match (quant, order, self.n) {
            (true, _, 1) => (1, 2, 1),
            (true, SumOrder::Ggml, _) => (2, 1, 1),
            (true, SumOrder::Block, _) => (4, 1, 1),
            (false, _, 1) => (1, 8, 1),
            (false, _, _) => (4, 4, 1),
        };
        Tiling {
            tokens,
            unroll,
            groups,
            order,
        }
    }

    /// The kernel's function name:
    /// `mul_mat_{type}_{k}x{m}x{n}_t{tokens}u{unroll}g{groups}` (`_block` appended for
    /// [`SumOrder::Block`]).
    pub fn kernel_name(&self, tiling: Tiling) -> String {
        format!(
            "mul_mat_{}_{}x{}x{}_t{}u{}g{}{}",
            self.wtype.name(),
            self.k,
            self.m,
            self.n,
            tiling.tokens,
            tiling.unroll,
            tiling.groups,
            match tiling.order {
                SumOrder::Ggml => "",
                SumOrder::Block => "_block",
            }
        )
    }
}

impl std::fmt::Display for MatmulSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} {{{}, {}}} x {{{}, {}}}",
            self.wtype.name(),
            self.k,
            self.m,
            self.k,
            self.n
        )
    }
}

/// A compiled matmul kernel for one [`MatmulSpec`]. Cheap to clone; `Send + Sync`.
#[derive(Clone)]
pub struct MatmulKernel {
    spec: MatmulSpec,
    tiling: Tiling,
    entry: KernelFn,
    /// The activation quantizer (quantized weight types).
    quantize: Option<FastQuant>,
    _code: Arc<JitCode>,
}

impl std::fmt::Debug for MatmulKernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MatmulKernel")
            .field("spec", &self.spec)
            .field("tiling", &self.tiling)
            .finish()
    }
}

/// Compiles the kernel for `spec` with its [`MatmulSpec::default_tiling`] (in its own JIT
/// module).
///
/// Errors: see [`MatmulSpec::validate`] and [`Jit::define`].
pub fn compile_matmul(spec: &MatmulSpec) -> Result<MatmulKernel> {
    compile_matmul_with(spec, spec.default_tiling())
}

/// Compiles the kernel for `spec` with an explicit tiling (for benchmarks and tuning).
///
/// Errors: as [`compile_matmul`], and [`CodegenError::Shape`] for a zero tiling.
pub fn compile_matmul_with(spec: &MatmulSpec, tiling: Tiling) -> Result<MatmulKernel> {
    compile(spec, tiling, false)
}

/// [`compile_matmul_with`] from Cranelift's portable instructions only, the forms aarch64
/// runs, on any host ([`Jit::portable`]): the same numbers as the host's own kernel, so the
/// tests of an x86-64 machine check them too.
///
/// Errors: as [`compile_matmul_with`].
pub fn compile_matmul_portable(spec: &MatmulSpec, tiling: Tiling) -> Result<MatmulKernel> {
    compile(spec, tiling, true)
}

/// One kernel in a module of its own ([`Jit::portable`] as `portable` says).
fn compile(spec: &MatmulSpec, tiling: Tiling, portable: bool) -> Result<MatmulKernel> {
    let mut jit = Jit::new()?;
    jit.portable(portable);
    let name = define_matmul(&mut jit, spec, tiling)?;
    let code = jit.finalize()?;
    MatmulKernel::from_code(code, &name, spec, tiling)
}

/// The machine code (Cranelift's VCode listing) of the kernel for `spec` and `tiling`, for
/// inspection (`kernel-bench --disasm`).
///
/// Errors: as [`compile_matmul_with`].
pub fn disassemble_matmul(spec: &MatmulSpec, tiling: Tiling) -> Result<String> {
    let mut jit = Jit::new()?;
    jit.keep_disasm(true);
    let name = define_matmul(&mut jit, spec, tiling)?;
    Ok(jit.disasm(&name).unwrap_or("").to_string())
}

/// Generates the kernel for `spec` into `jit` and returns its function name (for compiling
/// many kernels into one module; get the kernel with [`MatmulKernel::from_code`]).
///
/// Errors: see [`compile_matmul_with`].
pub fn define_matmul(jit: &mut Jit, spec: &MatmulSpec, tiling: Tiling) -> Result<String> {
    spec.validate()?;
    if !(1..=8).contains(&tiling.tokens) || tiling.unroll == 0 || !(1..=4).contains(&tiling.groups)
    {
        return Err(CodegenError::Shape(format!(
            "tiling {tiling:?}: tokens must be 1..=8, groups 1..=4, unroll at least 1"
        )));
    }
    let func = match QuantFormat::of(spec.wtype) {
        Some(fmt) => {
            let shape = generated::quant::QuantShape {
                fmt,
                k: spec.k,
                m: spec.m,
                n: spec.n,
                tiling,
            };
            match tiling.order {
                SumOrder::Ggml => build_matmul_fn(jit, |e, a| generated::quant::emit(e, a, &shape)),
                SumOrder::Block => {
                    build_matmul_fn(jit, |e, a| generated::quant_block::emit(e, a, &shape))
                }
            }
        }
        None => {
            let shape = generated::float::FloatShape {
                wtype: spec.wtype,
                k: spec.k,
                m: spec.m,
                n: spec.n,
                tiling,
            };
            build_matmul_fn(jit, |e, a| generated::float::emit(e, a, &shape))
        }
    };
    let name = spec.kernel_name(tiling);
    jit.define_kernel(&name, func)?;
    Ok(name)
}

impl MatmulKernel {
    /// The kernel for `spec` and `tiling` in a finalized module, where [`define_matmul`]
    /// generated it (`name` is what it returned).
    ///
    /// Errors: [`CodegenError::Compile`] when `name` is not the kernel name of `spec` and
    /// `tiling` or the module has no such function.
    pub fn from_code(
        code: Arc<JitCode>,
        name: &str,
        spec: &MatmulSpec,
        tiling: Tiling,
    ) -> Result<MatmulKernel> {
        // Only `define_matmul` defines functions with kernel names (`Jit::define` refuses
        // them), so the name vouches for the function's signature and shape.
        if name != spec.kernel_name(tiling) {
            return Err(CodegenError::Compile {
                name: name.to_string(),
                msg: format!("not the kernel of {spec} with {tiling:?}"),
            });
        }
        let addr = code.address(name).ok_or_else(|| CodegenError::Compile {
            name: name.to_string(),
            msg: "not defined in this module".to_string(),
        })?;
        // SAFETY: `addr` is the entry of a function generated by `define_matmul` with the
        // `KernelFn` signature (the host's C calling convention, which `Jit::new` checked
        // Cranelift's matches; five arguments, no result); `_code` keeps it alive.
        let entry = unsafe { std::mem::transmute::<usize, KernelFn>(addr) };
        let quantize = QuantFormat::of(spec.wtype).map(FastQuant::new);
        Ok(MatmulKernel {
            spec: *spec,
            tiling,
            entry,
            quantize,
            _code: code,
        })
    }

    /// The shape this kernel was generated for.
    pub fn spec(&self) -> &MatmulSpec {
        &self.spec
    }

    /// The tiling this kernel was generated with.
    pub fn tiling(&self) -> Tiling {
        self.tiling
    }

    /// Bytes of prepared activations this kernel reads.
    pub fn act_bytes(&self) -> usize {
        self.spec.act_bytes()
    }

    /// Prepares the activations `x` (`{k, n}` f32) for this kernel into `act`
    /// ([`MatmulKernel::act_bytes`] bytes): quantized to the weight type's companion format
    /// (layout in [`crate::actq`]; by the hand-written quantizer the executor uses too, see
    /// [`crate::handwritten`]), rounded through F16/BF16 for those weight types (ggml's
    /// `vec_dot_type`), copied for F32.
    ///
    /// Errors: [`CodegenError::BufferSize`] when a buffer has the wrong length.
    pub fn prepare(&self, x: &[f32], act: &mut [u8]) -> Result<()> {
        let s = &self.spec;
        check_len("activations (f32 values)", s.k * s.n, x.len())?;
        check_len("prepared activations", self.act_bytes(), act.len())?;
        self.prepare_tokens(x, act, 0..s.n)
    }

    /// As [`MatmulKernel::prepare`] for the tokens `tokens` only (`x` and `act` are still
    /// the whole buffers), so that a thread pool can split the work.
    ///
    /// Errors: [`CodegenError::BufferSize`] when a buffer has the wrong length;
    /// [`CodegenError::Shape`] when `tokens` is not inside `0..n`.
    pub fn prepare_tokens(&self, x: &[f32], act: &mut [u8], tokens: Range<usize>) -> Result<()> {
        let s = &self.spec;
        check_len("activations (f32 values)", s.k * s.n, x.len())?;
        check_len("prepared activations", self.act_bytes(), act.len())?;
        if tokens.start > tokens.end || tokens.end > s.n {
            return Err(CodegenError::Shape(format!("tokens {tokens:?} of {}", s.n)));
        }
        if let Some(q) = &self.quantize {
            let arb = act_row_bytes(s.k);
            let xs = &x[tokens.start * s.k..tokens.end * s.k];
            let out = &mut act[tokens.start * arb..tokens.end * arb];
            // Lengths were checked above and `k` is a multiple of 32 (`validate`), so this
            // cannot refuse; an empty token range writes nothing.
            if !tokens.is_empty() && !q.rows(xs, out, s.k) {
                return Err(CodegenError::Shape(format!("quantizing tokens {tokens:?}")));
            }
            return Ok(());
        }
        let (x, act) = (
            &x[tokens.start * s.k..tokens.end * s.k],
            &mut act[tokens.start * s.k * 4..tokens.end * s.k * 4],
        );
        for (v, o) in x.iter().zip(act.chunks_exact_mut(4)) {
            let r = match s.wtype {
                GgmlType::F16 => f16::from_f32(*v).to_f32(),
                GgmlType::BF16 => bf16_round(*v),
                _ => *v,
            };
            o.copy_from_slice(&r.to_le_bytes());
        }
        Ok(())
    }

    /// Computes output rows `rows` for all `n` tokens: `out` is the whole `{m, n}` result
    /// (`m · n` values); only `out[t·m + r]` for `r` in `rows` is written.
    ///
    /// Errors: [`CodegenError::Shape`] when `w` does not match the spec or `rows` is out of
    /// range or does not start (and end, unless at `m`) on a multiple of 4;
    /// [`CodegenError::BufferSize`] for wrong buffer lengths.
    pub fn call(
        &self,
        w: &RepackedWeight,
        act: &[u8],
        out: &mut [f32],
        rows: Range<usize>,
    ) -> Result<()> {
        self.check(w, act, out.len())?;
        self.check_rows(&rows)?;
        // SAFETY: sizes checked above; `out` is borrowed mutably for the call.
        unsafe { self.call_unchecked(w, act, out.as_mut_ptr(), rows) };
        Ok(())
    }

    /// Computes all rows, split over the threads of `pool` (each thread gets a contiguous
    /// range of 4-row groups).
    ///
    /// Errors: as [`MatmulKernel::call`].
    pub fn run(
        &self,
        pool: &ThreadPool,
        w: &RepackedWeight,
        act: &[u8],
        out: &mut [f32],
    ) -> Result<()> {
        self.check(w, act, out.len())?;
        let groups = w.groups();
        let m = self.spec.m;
        let out_ptr = SendPtr(out.as_mut_ptr());
        pool.run(&|ti, nt| {
            let g0 = groups * ti / nt;
            let g1 = groups * (ti + 1) / nt;
            let rows = (g0 * GROUP_ROWS).min(m)..(g1 * GROUP_ROWS).min(m);
            if rows.is_empty() {
                return;
            }
            let p = out_ptr;
            // SAFETY: sizes were checked; the threads' row ranges are disjoint, so no two
            // threads write the same element of `out`, which stays borrowed until `run`
            // returns (the pool joins all threads before that).
            unsafe { self.call_unchecked(w, act, p.0, rows) };
        });
        Ok(())
    }

    fn check(&self, w: &RepackedWeight, act: &[u8], out_len: usize) -> Result<()> {
        let s = &self.spec;
        if w.wtype() != s.wtype || w.k() != s.k || w.m() != s.m {
            return Err(CodegenError::Shape(format!(
                "weight {} {{{}, {}}} given to kernel for {s}",
                w.wtype().name(),
                w.k(),
                w.m()
            )));
        }
        check_len("prepared activations", self.act_bytes(), act.len())?;
        check_len("output (f32 values)", s.m * s.n, out_len)?;
        Ok(())
    }

    fn check_rows(&self, rows: &Range<usize>) -> Result<()> {
        let m = self.spec.m;
        if rows.start > rows.end
            || rows.end > m
            || !rows.start.is_multiple_of(GROUP_ROWS)
            || (!rows.end.is_multiple_of(GROUP_ROWS) && rows.end != m)
        {
            return Err(CodegenError::Shape(format!(
                "row range {rows:?} of {m} rows: must lie in 0..{m} and start/end on multiples of {GROUP_ROWS} (or end at {m})"
            )));
        }
        Ok(())
    }

    /// # Safety
    /// `w`, `act` and `out` (`m·n` values) must have passed `check`, `rows` `check_rows`,
    /// and no other thread may write `out` rows in `rows` during the call.
    unsafe fn call_unchecked(
        &self,
        w: &RepackedWeight,
        act: &[u8],
        out: *mut f32,
        rows: Range<usize>,
    ) {
        let m = self.spec.m;
        let g0 = rows.start / GROUP_ROWS;
        let full_end = (rows.end / GROUP_ROWS).min(m / GROUP_ROWS);
        if g0 < full_end {
            // SAFETY: the caller guarantees the buffer sizes the kernel was generated for;
            // the kernel writes only rows of groups g0..full_end.
            unsafe {
                (self.entry)(
                    w.data().as_ptr(),
                    act.as_ptr(),
                    out,
                    g0 as i64,
                    full_end as i64,
                )
            };
        }
        let tail_start = full_end.max(g0) * GROUP_ROWS;
        for r in tail_start..rows.end {
            for t in 0..self.spec.n {
                let v = scalar_row(&self.spec, w, act, r, t);
                // SAFETY: r < m and t < n, so the index is inside the m·n output.
                unsafe { *out.add(t * m + r) = v };
            }
        }
    }
}

#[derive(Clone, Copy)]
struct SendPtr(*mut f32);
// SAFETY: used only to hand disjoint output rows to pool threads (see `MatmulKernel::run`).
unsafe impl Send for SendPtr {}
// SAFETY: as above.
unsafe impl Sync for SendPtr {}

fn check_len(what: &'static str, expected: usize, got: usize) -> Result<()> {
    if expected != got {
        return Err(CodegenError::BufferSize {
            what,
            expected,
            got,
        });
    }
    Ok(())
}

/// ggml's fp32 → bf16 rounding (`ggml_compute_fp32_to_bf16`: round to nearest even, NaN
/// kept quiet), back to f32.
fn bf16_round(v: f32) -> f32 {
    if v.is_nan() {
        return bf16::from_bits(((v.to_bits() >> 16) | 64) as u16).to_f32();
    }
    let u = v.to_bits();
    let r = u.wrapping_add(0x7fff + ((u >> 16) & 1)) >> 16;
    bf16::from_bits(r as u16).to_f32()
}

fn f32_at(b: &[u8], at: usize) -> f32 {
    f32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// Output row `r`, token `t`, computed in plain Rust from the repacked weight and prepared
/// activations with the kernels' formula (used for the rows of a padded last group).
/// `w` and `act` must match `s` (as checked by `MatmulKernel::call`); indexes out of range
/// panic.
pub(crate) fn scalar_row(
    s: &MatmulSpec,
    w: &RepackedWeight,
    act: &[u8],
    r: usize,
    t: usize,
) -> f32 {
    let gb = w.group_bytes();
    let group = &w.data()[(r / GROUP_ROWS) * gb..][..gb];
    let lane = r % GROUP_ROWS;
    match QuantFormat::of(s.wtype) {
        Some(fmt) => {
            let arb = act_row_bytes(s.k);
            let gbb = fmt.group_block_bytes();
            // the kernels' (and ggml's AVX2) order: see the `quant` kernel module
            let mut acc = [0.0f32; 8];
            let mut summs = 0.0f32;
            for b in 0..s.k / QK {
                let g = &group[b * gbb..][..gbb];
                let a = &act[t * arb + b * ACT_BLOCK_BYTES..][..ACT_BLOCK_BYTES];
                let d = layout::scale_d(g, lane) * f32_at(a, 0);
                for (l, acc) in acc.iter_mut().enumerate() {
                    let lane_sum: i32 = (4 * l..4 * l + 4)
                        .map(|j| {
                            let q = layout::quant_at(&fmt, g, lane, j) - fmt.zero_point;
                            q * act_quant(a, j) as i32
                        })
                        .sum();
                    *acc = d.mul_add(lane_sum as f32, *acc);
                }
                if fmt.has_min {
                    summs += layout::scale_m(g, lane) * f32_at(a, ACT_AUX_OFFSET);
                }
            }
            let r = [
                acc[0] + acc[4],
                acc[1] + acc[5],
                acc[2] + acc[6],
                acc[3] + acc[7],
            ];
            let sum = (r[0] + r[2]) + (r[1] + r[3]);
            if fmt.has_min {
                sum + summs
            } else {
                sum
            }
        }
        None => {
            let mut acc = 0.0f32;
            for kk in 0..s.k {
                let wv = layout::float_weight(s.wtype, group, lane, kk);
                acc += wv * f32_at(act, (t * s.k + kk) * 4);
            }
            acc
        }
    }
}
