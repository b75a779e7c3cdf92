//! Matrix products over weights kept in ggml's own layout (row-major blocks, read in place
//! from the model file) for every block type that has no generated kernel, and for F16 /
//! BF16 weights (a block of one value; `vec_dot_type` F16 / BF16): the "row-dot" kernels.
//!
//! Everything here is derived from the format descriptions of `ir::ggml`: the activation
//! format is the weight type's `vec_dot_type` ([`ir::ggml::vec_dot_type`]), activations are
//! quantized to it by ggml's own quantizers ([`ir::ggml::quantize`], x86 flavour), and a row
//! size is [`ir::ggml::GgmlType::row_size`]. What remains per type is its dot product:
//! [`RowDot`] takes the hand-written AVX2 routine of [`crate::handwritten::qdot`] (one column),
//! [`crate::handwritten::qdot_tiled`] (products of many columns, where llama.cpp switches to
//! its tiled K-quant kernel or tinyBLAS) or [`crate::handwritten::qdot_repack`] (weights
//! llama.cpp repacks) where one exists, else the lane-faithful plain routine of `ir::ggml` that computes what llama.cpp's
//! x86 AVX2 kernel for that type computes (`ggml_vec_dot_<type>_<vec_dot_type>`,
//! ggml-cpu/arch/x86/quants.c), else ggml's scalar dot product of the type (correct, in
//! another summation order: [`RowDot::exact`] says which). So a type is supported here
//! exactly when `ir::ggml` can compute its dot product; no list is written out.
//!
//! Weights are not copied: a row is `row_size(k)` bytes at `row · row_size(k)` of the
//! tensor's data (GGUF tensor data is aligned to `general.alignment`, at least 32 bytes, and
//! the routines read unaligned).

use ir::ggml::{self, GgmlType, Q8Flavor, RepackKernel};

use crate::handwritten::{fdot, qdot, qdot_repack, qdot_tiled};
use crate::target::Tier;

/// Whether weights of type `wtype` can be multiplied by the row-dot kernels: a block type
/// whose x86 dot product `ir::ggml` (or [`crate::handwritten::qdot`]) computes.
pub fn supports(wtype: GgmlType) -> bool {
    RowDot::new(wtype, Tier::Plain).is_some()
}

/// Whether the row-dot kernels compute prompt-sized products of `wtype` weights (that
/// llama.cpp does not repack) in llama.cpp's x86 order with a 4 × 4 tile on this host: the
/// executor then takes them for prompts instead of a generated kernel (Q8_0 in the exact
/// mode).
pub(crate) fn tiles_prompts(wtype: GgmlType, tier: Tier) -> bool {
    RowDot::at_level(wtype, tier)
        .is_some_and(|d| d.exact() && (d.fast4x4.is_some() || d.fast_cols4x4.is_some()))
}

/// Whether `--kernels fast` takes the row-dot kernels' prompt products of a `wtype` weight
/// `ne` (ggml order) in llama.cpp's order: where they run on a packed 8 × 16 tile and the
/// generated block-order kernel measured slower (`modelc bench --kernels fast -p 512`,
/// SmolLM2, same minutes: Q4_0 806 → 1309–1322 t/s, Q2_K 868–875 → 1288–1296, Q3_K_M
/// 904–915 → 1333–1354; Q6_K, Q4_K and Q5_K measured 1–3% slower that way and keep the
/// generated kernel).
pub(crate) fn packs_prompts(wtype: GgmlType, ne: [u64; 4], tier: Tier) -> bool {
    matches!(wtype, GgmlType::Q4_0 | GgmlType::Q2_K | GgmlType::Q3_K)
        && RowDot::repacked_at_level(wtype, ne, tier)
            .is_some_and(|d| d.exact() && d.packed8x16.is_some())
}

/// Whether the row-dot kernels also take decode steps of `wtype` weights in the exact
/// order: types with a four-row routine on this host (`qdot::dot4rows_fn`: Q4_1, Q5_0,
/// Q5_1, Q8_0, Q6_K everywhere; Q3_K, Q5_K and IQ4_XS on AVX-512 VNNI hosts), whose decode
/// measured faster than the generated kernel's (SmolLM2 Q4_1, one thread: about 20% less
/// CPU time per token; BENCHMARKS.md, sessions 9, 19 and 20), so their weights are read in
/// place at every step size and never repacked.
pub(crate) fn decodes(wtype: GgmlType, tier: Tier) -> bool {
    RowDot::at_level(wtype, tier).is_some_and(|d| d.exact() && d.fast4rows.is_some())
}

/// Which order a weight's products follow (module doc).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Order {
    /// `ggml_vec_dot_*` (and, with several columns, tinyBLAS or the tiled K-quant kernel,
    /// as `ir::ggml::vec_dot_avx2_mul_mat` says) — lane-faithful x86 numbers.
    X86,
    /// ggml's repacked 8×8 kernels (`ir::ggml::repacked_by_llama_cpp`).
    Repacked,
    /// ggml's scalar `vec_dot` (no x86 reproduction of the type yet): within rounding.
    Scalar,
}

/// The dot product of one weight row with one prepared activation row, for one weight.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RowDot {
    wtype: GgmlType,
    /// The activation type (`vec_dot_type`).
    act: GgmlType,
    order: Order,
    /// A hand-written `vec_dot`-order routine, if the host can run one.
    fast: Option<qdot::DotFn>,
    /// A hand-written repacked-order routine, if the host can run one.
    fast_repack: Option<qdot_repack::RepackDotFn>,
    /// Its eight-row form, where the type has one.
    fast_repack8: Option<qdot_repack::RepackDot8Fn>,
    /// A hand-written routine for the many-column order (the tiled K-quant kernel,
    /// IQ4_NL's tinyBLAS), if the host can run one.
    fast_cols: Option<qdot_tiled::TiledFn>,
    /// Four-column forms of `fast`, `fast_cols`, `fast_repack` and `fast_repack8` (the
    /// weight's blocks unpacked once for four tokens; the same numbers per output).
    fast4: Option<qdot::Dot4Fn>,
    fast_cols4: Option<qdot_tiled::Tiled4Fn>,
    fast_repack4: Option<qdot_repack::RepackDot4Fn>,
    fast_repack8x4: Option<qdot_repack::RepackDot8x4Fn>,
    /// The eight-column form of `fast_repack8`, and Q4_K's gemm tile (AVX-512 VNNI hosts).
    fast_repack8x8: Option<qdot_repack::RepackDot8x8Fn>,
    /// The block-order tile of `--kernels fast` ([`RowDot::for_weight_block`]): taken for
    /// every eight columns, in place of llama.cpp's order.
    block8x8: Option<qdot_repack::RepackDot8x8Fn>,
    /// A 4 rows × 4 columns tile of the `vec_dot` order (Q5_0), and of the repacked order
    /// (Q4_K).
    fast4x4: Option<qdot::Dot4x4Fn>,
    /// A 4 × 8 tile of the `vec_dot` order over packed activations (Q8_0, Q5_0, Q4_1,
    /// Q5_1, Q6_K on AVX-512 hosts), and of tinyBLAS's order (F32, F16, BF16).
    packed4x8: Option<qdot::Packed4x8>,
    packed_cols4x8: Option<qdot::Packed4x8>,
    /// Eight rows × sixteen packed columns of the repacked order (Q4_0, IQ4_NL) or the
    /// block order, on AVX-512 VNNI hosts.
    packed8x16: Option<qdot_repack::Packed8x16>,
    /// A 4 × 4 tile of the many-column order (tinyBLAS: F16, BF16), and its 4 × 8 form
    /// (AVX-512 hosts).
    fast_cols4x4: Option<qdot::Dot4x4Fn>,
    fast_cols4x8: Option<fdot::Dot4x8Fn>,
    fast_repack4x4: Option<qdot_repack::RepackDot4x4Fn>,
    /// Four rows of `fast` with one column (decode), or of the repacked order's gemv
    /// (Q4_K on AVX-512 VNNI hosts).
    fast4rows: Option<qdot::Dot4RowsFn>,
    /// Every column in the repacked gemv kernel's order, as llama.cpp computes a decode
    /// token's product (`--kernels fast` for Q4_K on AMX hosts: one fused multiply-add per
    /// super-block where the gemm order has four).
    gemv_only: bool,
    /// Whether the row loops prefetch the rows ahead in software (the plan's choice:
    /// `crate::select::MatKernel::prefetch`).
    prefetch: bool,
}

impl RowDot {
    /// The dot product for a weight of type `wtype` that llama.cpp does not repack, if the
    /// type has one.
    pub fn new(wtype: GgmlType, tier: Tier) -> Option<RowDot> {
        RowDot::at_level(wtype, tier.min(Tier::host()))
    }

    /// [`RowDot::new`] with the routines of `tier` whatever the host has: for asking which
    /// routines a level has (`crate::select`), never for running them.
    pub(crate) fn at_level(wtype: GgmlType, tier: Tier) -> Option<RowDot> {
        let act = ggml::vec_dot_type(wtype)?;
        // Probe the references with one zero block: they refuse types they do not compute.
        let w = vec![0u8; wtype.type_size()];
        let a = vec![0u8; act.type_size() * wtype.block_size() / act.block_size()];
        let order = if ggml::vec_dot_avx2(wtype, &w, &a).is_ok() {
            Order::X86
        } else {
            ggml::vec_dot(wtype, &w, &a).ok()?;
            Order::Scalar
        };
        Some(RowDot {
            wtype,
            act,
            order,
            fast: qdot::dot_fn(wtype, tier),
            fast_repack: None,
            fast_repack8: None,
            fast_cols: qdot_tiled::tiled_fn(wtype, tier),
            fast4: qdot::dot4_fn(wtype, tier),
            fast_cols4: qdot_tiled::tiled4_fn(wtype, tier),
            fast_repack4: None,
            fast_repack8x4: None,
            fast_repack8x8: None,
            block8x8: None,
            fast4x4: qdot::dot4x4_fn(wtype, tier),
            packed4x8: qdot::packed4x8_fn(wtype, tier)
                .or_else(|| crate::handwritten::qdot_kpacked::packed4x8_fn(wtype, tier)),
            packed_cols4x8: fdot::packed4x8_fn(wtype, tier),
            packed8x16: qdot_repack::tiled_packed8x16_fn(wtype, tier),
            fast_cols4x4: tier
                .isa()
                .and_then(|isa| fdot::tinyblas4x4_fn_on(wtype, isa)),
            fast_cols4x8: fdot::tinyblas4x8_fn(wtype, tier),
            fast_repack4x4: None,
            fast4rows: qdot::dot4rows_fn(wtype, tier),
            gemv_only: false,
            prefetch: true,
        })
    }

    /// The dot product of `--kernels fast` for `wtype`, where this host has a block-order
    /// tile for it (`qdot_repack::block_dot8x8_fn`: Q4_1, Q5_0, Q5_1, Q8_0 with AVX-512
    /// VNNI): eight columns at a time in the block order, fewer columns (decode) in
    /// llama.cpp's; for Q4_K where this host has the sixteen-row AMX form, llama.cpp's
    /// repacked gemv order for every column (`gemv_only`: its decode kernel's numbers, for
    /// any shape); else `None` (the caller keeps its other kernels).
    pub fn for_weight_block(wtype: GgmlType, tier: Tier) -> Option<RowDot> {
        RowDot::block_at_level(wtype, tier.min(Tier::host()))
    }

    /// [`RowDot::for_weight_block`] at `tier` whatever the host has (as
    /// [`RowDot::at_level`]: for asking, never for running).
    pub(crate) fn block_at_level(wtype: GgmlType, tier: Tier) -> Option<RowDot> {
        if wtype == GgmlType::Q4_K {
            let dot = RowDot::repacked_at_level(wtype, [ggml::QK_K as u64, 8, 1, 1], tier)?;
            let amx = dot.packed8x16.is_some_and(|pk| pk.rows16.is_some());
            return (dot.order == Order::Repacked && amx).then_some(RowDot {
                gemv_only: true,
                ..dot
            });
        }
        let block8x8 = Some(qdot_repack::block_dot8x8_fn(wtype, tier)?);
        let dot = RowDot::at_level(wtype, tier)?;
        let packed8x16 = qdot_repack::block_packed8x16_fn(wtype, tier);
        (dot.order == Order::X86 && dot.fast4rows.is_some()).then_some(RowDot {
            block8x8,
            packed8x16,
            ..dot
        })
    }

    /// The dot product for the weight `ne` (ggml order) of type `wtype`: in the repacked
    /// kernels' order where llama.cpp's x86 build repacks it, else as [`RowDot::new`].
    pub fn for_weight(wtype: GgmlType, ne: [u64; 4], tier: Tier) -> Option<RowDot> {
        RowDot::repacked_at_level(wtype, ne, tier.min(Tier::host()))
    }

    /// [`RowDot::for_weight`] at `tier` whatever the host has (as [`RowDot::at_level`]).
    pub(crate) fn repacked_at_level(wtype: GgmlType, ne: [u64; 4], tier: Tier) -> Option<RowDot> {
        let repacked = ggml::repacked_by_llama_cpp(wtype, ne)
            && ggml::RepackedRow::new(wtype, &vec![0u8; wtype.type_size()]).is_ok();
        if !repacked {
            return RowDot::at_level(wtype, tier);
        }
        Some(RowDot {
            wtype,
            act: ggml::vec_dot_type(wtype)?,
            order: Order::Repacked,
            fast: None,
            fast_repack: qdot_repack::dot_fn(wtype, tier),
            fast_repack8: qdot_repack::dot8_fn(wtype, tier),
            fast_cols: None,
            fast4: None,
            fast_cols4: None,
            fast_repack4: qdot_repack::dot4_fn(wtype, tier),
            fast_repack8x4: qdot_repack::dot8x4_fn(wtype, tier),
            fast_repack8x8: qdot_repack::dot8x8_fn(wtype, tier),
            block8x8: None,
            fast4x4: None,
            packed4x8: None,
            packed_cols4x8: None,
            packed8x16: qdot_repack::packed8x16_fn(wtype, tier),
            fast_cols4x4: None,
            fast_cols4x8: None,
            fast_repack4x4: qdot_repack::dot4x4_fn(wtype, tier),
            fast4rows: qdot_repack::gemv4rows_fn(wtype, tier),
            gemv_only: false,
            prefetch: true,
        })
    }

    /// The same routines with the software prefetch of the row loops on or off (the same
    /// numbers).
    pub(crate) fn with_prefetch(self, prefetch: bool) -> RowDot {
        RowDot { prefetch, ..self }
    }

    /// Whether the products are llama.cpp's x86 numbers (else ggml's scalar order: within
    /// rounding of them).
    pub fn exact(&self) -> bool {
        self.order != Order::Scalar && self.block8x8.is_none() && !self.gemv_only
    }

    /// Whether a hand-written SIMD routine computes one-column products on this host.
    pub fn simd(&self) -> bool {
        self.fast.is_some() || self.fast_repack.is_some()
    }

    /// The activation type rows are prepared in.
    pub fn act_type(&self) -> GgmlType {
        self.act
    }

    /// Bytes of one prepared activation row of `k` values (`None` when `k` is not a whole
    /// number of blocks).
    pub fn act_row_bytes(&self, k: usize) -> Option<usize> {
        usize::try_from(self.act.row_size(k as u64)?).ok()
    }

    /// Bytes of one weight row of `k` values.
    pub fn row_bytes(&self, k: usize) -> Option<usize> {
        usize::try_from(self.wtype.row_size(k as u64)?).ok()
    }

    /// Quantizes the f32 row `x` into `dst` (`act_row_bytes(x.len())` bytes) as llama.cpp's
    /// x86 build does before the product (`from_float` of the `vec_dot_type`; the repacked
    /// kernels' 4-column quantizers give the same numbers, see `ir::ggml::quantize_q8_k_4x8`).
    pub fn prepare(&self, x: &[f32], dst: &mut [u8]) {
        if crate::handwritten::rowq::quantize(self.act, x, dst) {
            return;
        }
        // Lengths were checked when the kernel was lowered; the quantizer only fails on them.
        let _ = ggml::quantize(self.act, x, dst, Q8Flavor::X86);
    }

    /// The product of weight row `w` with prepared row `a`, the activation column `col` of a
    /// llama.cpp `mul_mat` with `n_cols` columns (which chooses its kernel: gemm or gemv for
    /// repacked weights, tinyBLAS or the tiled K-quant kernel from a few columns on). Whole
    /// rows, lengths as checked at lowering.
    #[inline]
    pub fn dot(&self, w: &[u8], a: &[u8], col: usize, n_cols: usize) -> f32 {
        match self.order {
            Order::Repacked => {
                let k = RepackKernel::for_column(col, n_cols);
                match self.fast_repack {
                    // SAFETY: `dot_fn` chose it for this host; whole rows of equal length.
                    Some(f) => unsafe { f(w, a, k) },
                    None => qdot_repack::dot_plain(self.wtype, w, a, k),
                }
            }
            Order::X86 if vec_dot_order(self.wtype, n_cols) => match self.fast {
                // SAFETY: `dot_fn` chose it for this host; whole rows of equal length.
                Some(f) => unsafe { f(w, a) },
                None => ggml::vec_dot_avx2(self.wtype, w, a).unwrap_or(f32::NAN),
            },
            Order::X86 => match self.fast_cols {
                // SAFETY: `tiled_fn` chose it for this host; whole rows of equal length.
                Some(f) => unsafe { f(w, a) },
                None => ggml::vec_dot_avx2_mul_mat(self.wtype, w, a, n_cols).unwrap_or(f32::NAN),
            },
            Order::Scalar => ggml::vec_dot(self.wtype, w, a).unwrap_or(f32::NAN),
        }
    }
}

impl RowDot {
    /// Whether [`RowDot::dot8`] computes eight rows at once.
    pub fn has_dot8(&self) -> bool {
        self.fast_repack8.is_some()
    }

    /// [`RowDot::dot`] of eight weight rows with one activation row, where
    /// [`RowDot::has_dot8`] (Q4_0 / IQ4_NL in the repacked order, whose gemm and gemv give
    /// the same numbers: the column does not matter); else `None`.
    #[inline]
    pub fn dot8(&self, w: &[&[u8]; 8], a: &[u8]) -> Option<[f32; 8]> {
        // SAFETY: `dot8_fn` chose it for this host; whole rows of equal length.
        self.fast_repack8.map(|f| unsafe { f(w, a) })
    }

    /// [`RowDot::dot`] of one weight row with the four activation rows `a` (columns
    /// `col..col + 4` of llama.cpp's `n_cols`), where a four-column routine computes them
    /// all in one kernel's order; else `None`.
    #[inline]
    pub fn dot4(&self, w: &[u8], a: &[&[u8]; 4], col: usize, n_cols: usize) -> Option<[f32; 4]> {
        match self.order {
            Order::Repacked => {
                let k = kernel_of_four(col, n_cols)?;
                // SAFETY: `dot4_fn` chose it for this host; whole rows of equal length.
                self.fast_repack4.map(|f| unsafe { f(w, a, k) })
            }
            // SAFETY (both): chosen for this host; whole rows of equal length.
            Order::X86 if vec_dot_order(self.wtype, n_cols) => {
                self.fast4.map(|f| unsafe { f(w, a) })
            }
            Order::X86 => self.fast_cols4.map(|f| unsafe { f(w, a) }),
            Order::Scalar => None,
        }
    }

    /// [`RowDot::dot4`] for four weight rows: `out[c][r]` for row `w[r]` and column `a[c]`,
    /// where a tile routine computes them in the kernel's order; else `None`.
    #[inline]
    pub fn dot4x4(
        &self,
        w: &[&[u8]; 4],
        a: &[&[u8]; 4],
        col: usize,
        n_cols: usize,
    ) -> Option<[[f32; 4]; 4]> {
        match self.order {
            Order::Repacked => {
                let k = kernel_of_four(col, n_cols)?;
                // SAFETY: `dot4x4_fn` chose it for this host; whole rows of equal length.
                self.fast_repack4x4.map(|f| unsafe { f(w, a, k) })
            }
            // SAFETY: `dot4x4_fn` chose it for this host; whole rows of equal length.
            Order::X86 if vec_dot_order(self.wtype, n_cols) => {
                self.fast4x4.map(|f| unsafe { f(w, a) })
            }
            // SAFETY: `tinyblas4x4_fn_on` chose it for this host; whole rows of equal length.
            Order::X86 if tinyblas_order(self.wtype, n_cols) => {
                self.fast_cols4x4.map(|f| unsafe { f(w, a) })
            }
            _ => None,
        }
    }

    /// [`RowDot::dot`] of four weight rows with the activation row `a` (column `col` of
    /// llama.cpp's `n_cols`), where a four-row routine computes them in the kernel's order
    /// (`vec_dot`, or the repacked types' gemv); else `None`.
    #[inline]
    pub fn dot4rows(
        &self,
        w: &[&[u8]; 4],
        a: &[u8],
        col: usize,
        n_cols: usize,
    ) -> Option<[f32; 4]> {
        let order = match self.order {
            Order::X86 => vec_dot_order(self.wtype, n_cols),
            Order::Repacked => RepackKernel::for_column(col, n_cols) == RepackKernel::Gemv,
            Order::Scalar => false,
        };
        // SAFETY: `dot4rows_fn` / `gemv4rows_fn` chose it for this host; whole rows of
        // equal length.
        order.then_some(self.fast4rows?).map(|f| unsafe { f(w, a) })
    }

    /// Whether the block order (`--kernels fast`) gives a chunk of `n` columns to
    /// llama.cpp's 4 × 8 tile instead of its own: eight to fifteen columns (a batched decode
    /// step), which its sixteen-lane tile would run at half its lanes (kernel-bench
    /// `--rows-batched --rows-tokens 8`, one thread, GMAC/s: Q4_1 92 against 69, Q8_0 77
    /// against 70).
    fn block_cols_on_4x8(&self, n: usize) -> bool {
        self.block8x8.is_some()
            && self.order == Order::X86
            && self.packed4x8.is_some()
            && (8..16).contains(&n)
    }

    /// The packed 4 × 8 tile, where the type has one for the order `n_cols` columns take
    /// (in a chunk of `n` columns: [`products_chunk`] packs eight columns at a time for it).
    fn packed4x8(&self, n_cols: usize, n: usize) -> Option<qdot::Packed4x8> {
        match self.order {
            Order::X86
                if vec_dot_order(self.wtype, n_cols)
                    && (self.block8x8.is_none() || self.block_cols_on_4x8(n)) =>
            {
                self.packed4x8
            }
            Order::X86 if tinyblas_order(self.wtype, n_cols) => self.packed_cols4x8,
            _ => None,
        }
    }

    /// The packed 8 × 16 tile for columns of llama.cpp's `n_cols`, where it computes their
    /// numbers: the repacked types' (gemm columns only where `gemm_only`), the block order,
    /// and the tiled K-quant order only where `n_cols` selects llama.cpp's tiled kernel (a
    /// batched decode step of several one-token sequences has `n_cols` 1: `vec_dot`), in a
    /// chunk of `n` columns.
    fn packed8x16(&self, n_cols: usize, n: usize) -> Option<qdot_repack::Packed8x16> {
        match self.order {
            Order::X86 if self.block8x8.is_none() && vec_dot_order(self.wtype, n_cols) => None,
            _ if self.block_cols_on_4x8(n) => None,
            _ => self.packed8x16,
        }
    }

    /// [`RowDot::dot4x4`] for eight activation rows (eight columns of llama.cpp's
    /// `n_cols`), where the type has that tile (tinyBLAS's order: the column does not
    /// matter); else `None`.
    #[inline]
    pub fn dot4x8(&self, w: &[&[u8]; 4], a: &[&[u8]; 8], n_cols: usize) -> Option<[[f32; 4]; 8]> {
        match self.order {
            // SAFETY: `tinyblas4x8_fn` chose it for this host; whole rows of equal length.
            Order::X86 if tinyblas_order(self.wtype, n_cols) => {
                self.fast_cols4x8.map(|f| unsafe { f(w, a) })
            }
            _ => None,
        }
    }

    /// Whether [`RowDot::dot4x4`] has a routine (for some columns).
    fn has_tile4x4(&self) -> bool {
        self.fast4x4.is_some() || self.fast_cols4x4.is_some() || self.fast_repack4x4.is_some()
    }

    /// [`RowDot::dot`] of eight weight rows with the eight activation rows `a` (columns
    /// `col..col + 8` of llama.cpp's `n_cols`): `out[c][i]` for row `w[i]` and column `a[c]`,
    /// where the type has that form on this host and the eight columns take the repacked
    /// gemm kernel (or in the block order, [`RowDot::for_weight_block`]); else `None`.
    #[inline]
    pub fn dot8x8(
        &self,
        w: &[&[u8]; 8],
        a: &[&[u8]; 8],
        col: usize,
        n_cols: usize,
    ) -> Option<[[f32; 8]; 8]> {
        if let Some(f) = self.block8x8 {
            // SAFETY: `block_dot8x8_fn` chose it for this host; whole rows of equal length.
            return Some(unsafe { f(w, a) });
        }
        if RepackKernel::for_column(col + 7, n_cols) != RepackKernel::Gemm {
            return None;
        }
        // SAFETY: `dot8x8_fn` chose it for this host; whole rows of equal length.
        self.fast_repack8x8.map(|f| unsafe { f(w, a) })
    }

    /// [`RowDot::dot8`] for four activation rows: `out[c][i]` for row `i` and column `c`,
    /// where the type has that form; else `None`.
    #[inline]
    pub fn dot8x4(&self, w: &[&[u8]; 8], a: &[&[u8]; 4]) -> Option<[[f32; 8]; 4]> {
        // SAFETY: `dot8x4_fn` chose it for this host; whole rows of equal length.
        self.fast_repack8x4.map(|f| unsafe { f(w, a) })
    }
}

/// Rows `r0..r1` of `out` (`out[t·out_stride + r]`) for tokens `0..n`: weight row `r` is
/// `row_bytes` at `w + r·row_bytes`, token `t`'s prepared activations `act_row` bytes at
/// `act + t·act_row`, token `t` being column `col0 + t` of llama.cpp's `n_cols`. Eight rows
/// at a time where the kernel has that form and `r` is a multiple of 8.
///
/// With `reuse_panels`, the activations packed for a tile by an earlier call on this
/// thread are used again when they are the same tokens at the same address: the caller
/// calls [`new_inputs`] on this thread whenever activations it passes may have changed.
///
/// # Safety
/// The pointers must cover those rows, tokens and outputs; with `reuse_panels`, as above.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn products(
    dot: &RowDot,
    w: *const u8,
    row_bytes: usize,
    act: *const u8,
    act_row: usize,
    (n, col0, n_cols): (usize, usize, usize),
    out: *mut f32,
    out_stride: usize,
    (r0, r1): (usize, usize),
    reuse_panels: bool,
) {
    // One column of one: llama.cpp's kernel for a lone column (gemv) for every column.
    let n_cols = if dot.gemv_only { 1 } else { n_cols };
    // Tokens in chunks: 64 for the packed tiles (their panels stay in L2, the rows of a
    // tile in L1), else chunks whose prepared activations stay in L1 while every row of
    // the range passes over them (each weight row is read once per chunk, from L2 at
    // worst).
    let packed16 = dot.packed8x16(n_cols, n);
    let chunk = if packed16.is_some_and(|pk| pk.rows16.is_some()) {
        // The sixteen-row form unpacks each weight block once per chunk: twice as many
        // columns as below halve that work (the panels, 8 × 4.6 KiB per block, stay in L2).
        128
    } else if packed16.is_some() {
        // Whole groups of sixteen for the packed 8 × 16 tile, as many as a chunk may hold:
        // each row tile then runs over every group's panel (from L2) while its rows stay
        // in L1, and the weights are read once per 64 tokens, not once per 16.
        64
    } else if dot.packed4x8(n_cols, n).is_some() {
        // As many tokens as a chunk may hold: each four rows (in L1; F16 / BF16 rows
        // widened to f32 once) run over every group's panel (from L2), and the weights
        // are read once per 64 tokens.
        64
    } else {
        (TOKEN_CHUNK_BYTES / act_row.max(1)).clamp(4, 64) & !3
    };
    let mut t0 = 0;
    while t0 < n {
        let nt = chunk.min(n - t0);
        products_chunk(
            dot,
            (w, row_bytes),
            (act.add(t0 * act_row), act_row),
            (nt, col0 + t0, n_cols),
            out.add(t0 * out_stride),
            out_stride,
            (r0, r1),
            reuse_panels,
        );
        t0 += nt;
    }
}

/// How many rows ahead the row loops of [`products_chunk`] prefetch. 8, not 2: decode of
/// the synthetic 1B Q4_K_M (one Q4_K row at a time from DRAM) against llama.cpp, alternating
/// runs, went from 0.88–1.03× to 1.04–1.08×; the L3-resident SmolLM2 files did not move.
const PREFETCH_ROWS: usize = 8;

/// Asks for the `len` bytes at `p` to be brought into the cache (no effect elsewhere than
/// x86-64; a prefetch never faults).
#[inline(always)]
pub(crate) fn prefetch(p: *const u8, len: usize) {
    #[cfg(target_arch = "x86_64")]
    for off in (0..len).step_by(64) {
        // SAFETY: prefetching has no architectural effect and never faults.
        unsafe {
            std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
                p.wrapping_add(off) as *const i8,
            )
        };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (p, len);
}

/// Bytes of prepared activations [`products`] keeps hot at a time (about half of a
/// 32–48 KiB L1 data cache).
const TOKEN_CHUNK_BYTES: usize = 20 * 1024;

/// What a packed panel holds: the activations at `act` (`act_row` bytes per token), `n`
/// tokens, packed by the function at address `pack`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct PanelKey {
    act: usize,
    act_row: usize,
    n: usize,
    pack: usize,
}

/// Most panels a thread keeps for reuse between [`new_inputs`] calls (a multi-sequence
/// step's runs each have their own).
const MAX_PANELS: usize = 8;

/// A panel's bytes, starting on a cache line (AMX tile loads of a row that straddles two
/// lines cost about a quarter more).
#[derive(Debug, Default)]
struct PanelBuf(Vec<Line>);

/// One cache line of a [`PanelBuf`].
#[derive(Clone, Copy, Debug)]
#[repr(C, align(64))]
struct Line([u8; 64]);

impl PanelBuf {
    /// Makes room for `len` bytes (their values unspecified).
    fn resize(&mut self, len: usize) {
        self.0.resize(len.div_ceil(64), Line([0; 64]));
    }

    fn as_ptr(&self) -> *const u8 {
        self.0.as_ptr() as *const u8
    }

    fn as_mut_ptr(&mut self) -> *mut u8 {
        self.0.as_mut_ptr() as *mut u8
    }
}

/// A thread's packed activation panels: `entries[..live]` are valid for reuse, the rest
/// are spare buffers (kept so that a step allocates nothing once warm).
#[derive(Debug, Default)]
struct Panels {
    entries: Vec<(PanelKey, PanelBuf)>,
    live: usize,
}

impl Panels {
    /// The entry for `key`: `(index, false)` where a live one holds it (only looked up
    /// with `reuse`), else `(index, true)` for a buffer the caller packs `key` into — the
    /// next spare one (kept live with `reuse` while there is room), or the last when all
    /// are live.
    fn slot(&mut self, key: PanelKey, reuse: bool) -> (usize, bool) {
        if let Some(i) = self.entries[..self.live]
            .iter()
            .position(|(e, _)| reuse && *e == key)
        {
            return (i, false);
        }
        let i = self.live.min(MAX_PANELS - 1);
        if i == self.entries.len() {
            self.entries.push((key, PanelBuf::default()));
        }
        self.entries[i].0 = key;
        if reuse && self.live < MAX_PANELS {
            self.live += 1;
        }
        (i, true)
    }
}

thread_local! {
    /// Each thread's packed activation panels of [`products_chunk`].
    static PANELS: std::cell::RefCell<Panels> = std::cell::RefCell::new(Panels::default());
    /// Each thread's buffer for the f32 rows of [`qdot::Packed4x8::widen`].
    static WIDE: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Forgets the calling thread's packed panels: the activations [`products`] reads with
/// `reuse_panels` may have changed since its last call on this thread.
pub(crate) fn new_inputs() {
    PANELS.with(|p| p.borrow_mut().live = 0);
}

/// [`products`] for one chunk of `n` tokens (columns `col0..col0 + n`).
///
/// # Safety
/// As [`products`].
#[allow(clippy::too_many_arguments)]
unsafe fn products_chunk(
    dot: &RowDot,
    (w, row_bytes): (*const u8, usize),
    (act, act_row): (*const u8, usize),
    (n, col0, n_cols): (usize, usize, usize),
    out: *mut f32,
    out_stride: usize,
    (r0, r1): (usize, usize),
    reuse_panels: bool,
) {
    let row = |r: usize| std::slice::from_raw_parts(w.add(r * row_bytes), row_bytes);
    let arow = |t: usize| std::slice::from_raw_parts(act.add(t * act_row), act_row);
    let arows4 = |t: usize| -> [&[u8]; 4] { std::array::from_fn(|c| arow(t + c)) };
    let arows8 = |t: usize| -> [&[u8]; 8] { std::array::from_fn(|c| arow(t + c)) };
    // Eight columns at a time packed once for the 4 × 8 tile, where the type has it.
    let nb = act_row / dot.act.type_size();
    let packed = dot
        .packed4x8(n_cols, n)
        .filter(|pk| n >= 8 && nb.is_multiple_of(pk.multiple));
    // A type with no other tile (Q6_K) also takes it for a last group of four to seven
    // columns, padded with copies of the chunk's last column (their products are
    // computed and dropped): cheaper than one product at a time.
    let packed = packed.or_else(|| {
        dot.packed4x8(n_cols, n)
            .filter(|pk| n >= 4 && !dot.has_tile4x4() && nb.is_multiple_of(pk.multiple))
    });
    // Columns the packed 4 × 8 tile computes: whole groups of eight, and a padded last
    // group where the type takes it.
    let end8 = match packed {
        Some(_) if !dot.has_tile4x4() && n % 8 >= 4 => n,
        Some(_) => n / 8 * 8,
        None => 0,
    };
    // Sixteen columns at a time packed once for the 8 × 16 tile, where the type has it (a
    // last group of fewer is padded with copies of the chunk's last column, whose
    // products are computed and dropped).
    // (A gemm-only tile's gemv form takes four or more, in its eight-column form up to
    // eight: each of those columns alone costs more than a padded group of eight.)
    let packed16 = dot
        .packed8x16(n_cols, n)
        .filter(|pk| n >= 8 || n >= 4 && pk.gemv.is_some());
    // The panels: packed here, or (`reuse_panels`) found packed by an earlier chunk of
    // this thread since its last `new_inputs`: one packing per thread and phase, not one
    // per chunk (the packing was 3.5% of `batched_decode`'s time when done per chunk).
    let key = packed
        .map(|pk| pk.pack as usize)
        .or(packed16.map(|pk| pk.pack as usize))
        .map(|pack| PanelKey {
            act: act as usize,
            act_row,
            n,
            pack,
        });
    let mut panels = match key {
        Some(_) => PANELS.with(|p| std::mem::take(&mut *p.borrow_mut())),
        None => Panels::default(),
    };
    let slot = key.map(|k| panels.slot(k, reuse_panels));
    if let Some((i, true)) = slot {
        let panel = &mut panels.entries[i].1;
        if let Some(pk) = packed {
            let group = nb * pk.block_bytes;
            let groups = end8.div_ceil(8);
            panel.resize(groups * group);
            for g in 0..groups {
                let cols: [&[u8]; 8] = std::array::from_fn(|c| arow((8 * g + c).min(n - 1)));
                (pk.pack)(&cols, nb, panel.as_mut_ptr().add(g * group));
            }
        } else if let Some(pk) = packed16 {
            let group = nb * pk.block_bytes;
            panel.resize(n.div_ceil(16) * group);
            for g in 0..n.div_ceil(16) {
                let cols: [&[u8]; 16] = std::array::from_fn(|c| arow((16 * g + c).min(n - 1)));
                (pk.pack)(&cols, nb, panel.as_mut_ptr().add(g * group));
            }
        }
    }
    let panel: *const u8 = slot.map_or(std::ptr::null(), |(i, _)| panels.entries[i].1.as_ptr());
    // The columns the packed 8 × 16 tiles cover: all of them, or for a gemm-only tile
    // those before llama.cpp's first gemv column.
    let end16 = match packed16 {
        Some(pk) if pk.gemm_only => (0..n)
            .find(|&t| RepackKernel::for_column(col0 + t, n_cols) != RepackKernel::Gemm)
            .unwrap_or(n),
        Some(_) => n,
        None => 0,
    };
    // The packed 8 × 16 tiles of rows `r..r + 8`: the columns they covered.
    let sixteen = |r: usize, ws: &[&[u8]; 8]| -> usize {
        let Some(pk) = packed16 else { return 0 };
        let mut t = 0;
        while t < end16 {
            let v = (pk.tile)(ws, panel.add(t / 16 * nb * pk.block_bytes), nb);
            for (c, vc) in v.iter().enumerate().take(end16 - t) {
                std::ptr::copy_nonoverlapping(vc.as_ptr(), out.add((t + c) * out_stride + r), 8);
            }
            t += 16;
        }
        // The gemv columns after them, where the type has that tile too (a group the gemm
        // columns began is computed again, its gemv columns kept).
        let Some([gemv16, gemv8]) = pk.gemv else {
            return end16;
        };
        let mut g = end16 / 16;
        while 16 * g < n {
            // The eight-column form where no column past the group's eighth is needed.
            let gemv = if n <= 16 * g + 8 { gemv8 } else { gemv16 };
            let v = gemv(ws, panel.add(g * nb * pk.block_bytes), nb);
            for c in (16 * g).max(end16)..n.min(16 * g + 16) {
                let vc = &v[c - 16 * g];
                std::ptr::copy_nonoverlapping(vc.as_ptr(), out.add(c * out_stride + r), 8);
            }
            g += 1;
        }
        n
    };
    let mut r = r0;
    // Sixteen rows against every panel of the chunk at once where the tile has that form
    // (the K-quants on AMX hosts): each weight block is unpacked once for all the chunk's
    // columns. It takes the gemm columns and the gemv ones after them (so a gemm-only
    // tile needs its gemv form), and a last group of fewer than sixteen rows (padded with
    // copies of its last row, whose results are dropped).
    let rows16 = packed16
        .filter(|pk| !pk.gemm_only || pk.gemv.is_some())
        .and_then(|pk| Some((pk, pk.rows16?)));
    if let Some((pk, rows16)) = rows16 {
        let groups = n.div_ceil(16);
        while r < r1 {
            let m = (r1 - r).min(16);
            let ws: [&[u8]; 16] = std::array::from_fn(|i| row(r + i.min(m - 1)));
            if dot.prefetch && r + 16 + PREFETCH_ROWS < r1 {
                prefetch(w.add((r + 16 + PREFETCH_ROWS) * row_bytes), 16 * row_bytes);
            }
            let at = out.add(r);
            if end16 > 0 {
                let g = (0, end16.div_ceil(16));
                rows16(&ws, panel, nb, g, false, at, out_stride, (m, (0, end16)));
            }
            if end16 < n && pk.gemv.is_some() {
                let g = (end16 / 16, groups);
                rows16(&ws, panel, nb, g, true, at, out_stride, (m, (end16, n)));
            }
            r += m;
        }
    }
    while dot.has_dot8() && r % 8 == 0 && r + 8 <= r1 {
        let ws: [&[u8]; 8] = std::array::from_fn(|i| row(r + i));
        let mut t = sixteen(r, &ws);
        while t + 8 <= n {
            let Some(v) = dot.dot8x8(&ws, &arows8(t), col0 + t, n_cols) else {
                break;
            };
            for (c, vc) in v.iter().enumerate() {
                std::ptr::copy_nonoverlapping(vc.as_ptr(), out.add((t + c) * out_stride + r), 8);
            }
            t += 8;
        }
        while t + 4 <= n {
            let Some(v) = dot.dot8x4(&ws, &arows4(t)) else {
                break;
            };
            for (c, vc) in v.iter().enumerate() {
                std::ptr::copy_nonoverlapping(vc.as_ptr(), out.add((t + c) * out_stride + r), 8);
            }
            t += 4;
        }
        for t in t..n {
            if let Some(v) = dot.dot8(&ws, arow(t)) {
                std::ptr::copy_nonoverlapping(v.as_ptr(), out.add(t * out_stride + r), 8);
            }
        }
        r += 8;
    }
    // Rows r..r + 4 for tokens t0..n: 4 × 4 tiles where they apply, the rest one by one.
    // F16 / BF16 rows widened to f32 for the packed tile, four at a time, once per call
    // of `four_rows` (not once per eight columns).
    let widen = packed.and_then(|pk| pk.widen);
    let mut wide = match widen {
        Some(_) => WIDE.with(|p| std::mem::take(&mut *p.borrow_mut())),
        None => Vec::new(),
    };
    if widen.is_some() {
        wide.resize(6 * nb, 0.0);
    }
    let wide_ptr = wide.as_mut_ptr();
    let four_rows = |r: usize, t0: usize| {
        let ws: [&[u8]; 4] = std::array::from_fn(|i| row(r + i));
        let tile_ws: [&[u8]; 4] = match widen.filter(|_| t0 + 8 <= n) {
            Some(widen) => std::array::from_fn(|i| {
                let dst = wide_ptr.add(i * nb);
                widen(ws[i].as_ptr(), nb, dst);
                std::slice::from_raw_parts(dst as *const u8, 4 * nb)
            }),
            None => ws,
        };
        let mut t = t0;
        while let Some(pk) = packed.filter(|_| t < end8) {
            let v = (pk.tile)(&tile_ws, panel.add(t / 8 * nb * pk.block_bytes), nb);
            for (c, vc) in v.iter().enumerate().take(end8 - t) {
                std::ptr::copy_nonoverlapping(vc.as_ptr(), out.add((t + c) * out_stride + r), 4);
            }
            t += 8;
        }
        let mut t = t.min(n);
        while t + 8 <= n {
            let Some(v) = dot.dot4x8(&ws, &arows8(t), n_cols) else {
                break;
            };
            for (c, vc) in v.iter().enumerate() {
                std::ptr::copy_nonoverlapping(vc.as_ptr(), out.add((t + c) * out_stride + r), 4);
            }
            t += 8;
        }
        while t + 4 <= n {
            let Some(v) = dot.dot4x4(&ws, &arows4(t), col0 + t, n_cols) else {
                break;
            };
            for (c, vc) in v.iter().enumerate() {
                std::ptr::copy_nonoverlapping(vc.as_ptr(), out.add((t + c) * out_stride + r), 4);
            }
            t += 4;
        }
        for (i, wr) in ws.iter().enumerate() {
            for t in t..n {
                *out.add(t * out_stride + r + i) = dot.dot(wr, arow(t), col0 + t, n_cols);
            }
        }
    };
    // Eight rows × eight columns where the type has that tile without the eight-row forms
    // above (the K- and I-quants; the block order); the columns left over go through the
    // 4 × 4 tiles of each half.
    let tile8x8 = (dot.fast_repack8x8.is_some() && !dot.has_dot8())
        || (dot.block8x8.is_some() && !dot.block_cols_on_4x8(n))
        || packed16.is_some();
    while tile8x8 && r % 8 == 0 && r + 8 <= r1 && (n >= 8 || packed16.is_some()) {
        let ws: [&[u8]; 8] = std::array::from_fn(|i| row(r + i));
        if dot.prefetch && r + 8 + PREFETCH_ROWS < r1 {
            prefetch(w.add((r + 8 + PREFETCH_ROWS) * row_bytes), 8 * row_bytes);
        }
        let mut t = sixteen(r, &ws);
        while t + 8 <= n {
            let Some(v) = dot.dot8x8(&ws, &arows8(t), col0 + t, n_cols) else {
                break;
            };
            for (c, vc) in v.iter().enumerate() {
                std::ptr::copy_nonoverlapping(vc.as_ptr(), out.add((t + c) * out_stride + r), 8);
            }
            t += 8;
        }
        four_rows(r, t);
        four_rows(r + 4, t);
        r += 8;
    }
    // Six rows at a time where the packed tile has that form (the float types: a panel
    // load then feeds six multiply-adds), the columns past the last whole panel one by one.
    let tile6 = packed.and_then(|pk| pk.tile6).filter(|_| n >= 8);
    while let Some(tile6) = tile6.filter(|_| r + 6 <= r1) {
        if dot.prefetch && r + 6 + PREFETCH_ROWS < r1 {
            prefetch(w.add((r + 6 + PREFETCH_ROWS) * row_bytes), 6 * row_bytes);
        }
        let ws: [&[u8]; 6] = std::array::from_fn(|i| row(r + i));
        let mut tile_ws = ws;
        if let Some(widen) = widen {
            for (i, tw) in tile_ws.iter_mut().enumerate() {
                let dst = wide_ptr.add(i * nb);
                widen(ws[i].as_ptr(), nb, dst);
                *tw = std::slice::from_raw_parts(dst as *const u8, 4 * nb);
            }
        }
        let group = nb * packed.map_or(0, |pk| pk.block_bytes);
        let mut t = 0;
        while t + 8 <= n {
            let v = tile6(&tile_ws, panel.add(t / 8 * group), nb);
            for (c, vc) in v.iter().enumerate() {
                std::ptr::copy_nonoverlapping(vc.as_ptr(), out.add((t + c) * out_stride + r), 6);
            }
            t += 8;
        }
        for (i, wr) in ws.iter().enumerate() {
            for t in t..n {
                *out.add(t * out_stride + r + i) = dot.dot(wr, arow(t), col0 + t, n_cols);
            }
        }
        r += 6;
    }
    while (dot.has_tile4x4() || packed.is_some()) && r + 4 <= r1 && n >= 4 {
        if dot.prefetch && r + 4 + PREFETCH_ROWS < r1 {
            prefetch(w.add((r + 4 + PREFETCH_ROWS) * row_bytes), 4 * row_bytes);
        }
        four_rows(r, 0);
        r += 4;
    }
    // Decode: four rows a pass where the type has that form, the next four prefetched.
    while dot.fast4rows.is_some() && n < 4 && r + 4 <= r1 {
        let ws: [&[u8]; 4] = std::array::from_fn(|i| row(r + i));
        if dot.prefetch && r + 8 <= r1 {
            prefetch(w.add((r + 4) * row_bytes), 4 * row_bytes);
        }
        for t in 0..n {
            match dot.dot4rows(&ws, arow(t), col0 + t, n_cols) {
                Some(v) => {
                    std::ptr::copy_nonoverlapping(v.as_ptr(), out.add(t * out_stride + r), 4)
                }
                None => {
                    for (i, wr) in ws.iter().enumerate() {
                        *out.add(t * out_stride + r + i) = dot.dot(wr, arow(t), col0 + t, n_cols);
                    }
                }
            }
        }
        r += 4;
    }
    for r in r..r1 {
        let wr = row(r);
        // A row or two ahead: the hardware prefetcher alone left decode at ~55% of the
        // read bandwidth (`kernel-bench --only rows`).
        if dot.prefetch && r + PREFETCH_ROWS < r1 {
            prefetch(w.add((r + PREFETCH_ROWS) * row_bytes), row_bytes);
        }
        let mut t = 0;
        while t + 4 <= n {
            let Some(v) = dot.dot4(wr, &arows4(t), col0 + t, n_cols) else {
                break;
            };
            for (c, &vc) in v.iter().enumerate() {
                *out.add((t + c) * out_stride + r) = vc;
            }
            t += 4;
        }
        for t in t..n {
            *out.add(t * out_stride + r) = dot.dot(wr, arow(t), col0 + t, n_cols);
        }
    }
    if key.is_some() {
        PANELS.with(|p| *p.borrow_mut() = panels);
    }
    if widen.is_some() {
        WIDE.with(|p| *p.borrow_mut() = wide);
    }
}

/// The offsets of a block's f16 scale-like fields (`d`, `m`, `dmin`) from `ir::ggml`'s
/// description of the format: where tests write moderate scales into random blocks (random
/// bytes would give NaN, infinity and subnormals). Empty for the float types and IQ1_M.
#[cfg(test)]
pub(crate) fn f16_scale_offsets(t: GgmlType) -> Vec<usize> {
    use ir::ggml::{FieldKind, ScalarKind};
    ggml::block_format(t)
        .map(|f| {
            f.fields
                .iter()
                .filter(|field| {
                    matches!(
                        field.kind,
                        FieldKind::Scale(ScalarKind::F16)
                            | FieldKind::Min(ScalarKind::F16)
                            | FieldKind::MinScale(ScalarKind::F16)
                    )
                })
                .map(|field| field.offset)
                .collect()
        })
        .unwrap_or_default()
}

/// The repacked kernel (gemm or gemv) of columns `col..col + 4` of llama.cpp's `n_cols`, if
/// the four take the same one.
fn kernel_of_four(col: usize, n_cols: usize) -> Option<RepackKernel> {
    let k = RepackKernel::for_column(col, n_cols);
    (RepackKernel::for_column(col + 3, n_cols) == k).then_some(k)
}

/// Whether llama.cpp's x86 `mul_mat` with `n_cols` activation columns computes a product of
/// `wtype` weights (not repacked) with `ggml_vec_dot_*` or a kernel giving the same numbers
/// (tinyBLAS for Q4_0 / Q5_0 / Q8_0): `ir::ggml::x86_mul_mat_kernel` decides.
fn vec_dot_order(wtype: GgmlType, n_cols: usize) -> bool {
    match ggml::x86_mul_mat_kernel(wtype, n_cols) {
        ggml::X86MulMatKernel::VecDot => true,
        ggml::X86MulMatKernel::TinyBlas => ggml::tinyblas_same_as_vec_dot(wtype),
        ggml::X86MulMatKernel::Tiled => false,
    }
}

/// Whether that kernel is tinyBLAS in an order of its own (not `vec_dot`'s numbers).
fn tinyblas_order(wtype: GgmlType, n_cols: usize) -> bool {
    ggml::x86_mul_mat_kernel(wtype, n_cols) == ggml::X86MulMatKernel::TinyBlas
        && !ggml::tinyblas_same_as_vec_dot(wtype)
}

/// A stand-alone row-dot product `out{m, n} = W{k, m} · x{k, n}` over a weight in ggml's
/// layout, for benchmarks and tests (plans use the same [`RowDot`] through their fused
/// matmul op).
#[derive(Debug)]
pub struct RowsMatmul {
    dot: RowDot,
    k: usize,
    m: usize,
    n: usize,
    row_bytes: usize,
    act_row: usize,
    /// llama.cpp's column count for each token: `n` (one product of `n` columns, a
    /// prompt) or 1 (each token its own product: a batched decode step).
    n_cols: usize,
}

impl RowsMatmul {
    /// The product for weights of type `wtype` with `k` values per row, `m` rows and `n`
    /// tokens, with the routines of this host's level ([`Tier::host`]).
    ///
    /// Errors: [`crate::CodegenError::UnsupportedType`] for a type without a row-dot
    /// routine; [`crate::CodegenError::Shape`] when `k` is not a whole number of blocks.
    pub fn new(wtype: GgmlType, k: usize, m: usize, n: usize) -> crate::Result<RowsMatmul> {
        let dot = RowDot::for_weight(wtype, [k as u64, m as u64, 1, 1], Tier::host())
            .ok_or(crate::CodegenError::UnsupportedType(wtype.name()))?;
        let (row_bytes, act_row) = dot.row_bytes(k).zip(dot.act_row_bytes(k)).ok_or_else(|| {
            crate::CodegenError::Shape(format!("{k} values are not whole {} blocks", wtype.name()))
        })?;
        Ok(RowsMatmul {
            dot,
            k,
            m,
            n,
            row_bytes,
            act_row,
            n_cols: n,
        })
    }

    /// The same product with each token its own one-column product, as in a batched decode
    /// step of `n` sequences (llama.cpp's kernel for one column, `vec_dot` or gemv).
    pub fn batched(self) -> RowsMatmul {
        RowsMatmul { n_cols: 1, ..self }
    }

    /// The same product in the block order of `--kernels fast` ([`RowDot::for_weight_block`]),
    /// where this host has that tile for the type; else `None`.
    pub fn block_order(self) -> Option<RowsMatmul> {
        let dot = RowDot::for_weight_block(self.dot.wtype, Tier::host())?;
        Some(RowsMatmul { dot, ..self })
    }

    /// Whether the products are llama.cpp's x86 numbers ([`RowDot::exact`]).
    pub fn exact(&self) -> bool {
        self.dot.exact()
    }

    /// Whether a hand-written SIMD routine computes one-column products on this host.
    pub fn simd(&self) -> bool {
        self.dot.simd()
    }

    /// Bytes of the prepared activations of all `n` tokens.
    pub fn act_bytes(&self) -> usize {
        self.act_row * self.n
    }

    /// Bytes of the weight (`m` rows).
    pub fn weight_bytes(&self) -> usize {
        self.row_bytes * self.m
    }

    /// Quantizes `x` (`{k, n}` f32) into `act` ([`act_bytes`](Self::act_bytes)).
    ///
    /// Errors: [`crate::CodegenError::BufferSize`] on wrong lengths.
    pub fn prepare(&self, x: &[f32], act: &mut [u8]) -> crate::Result<()> {
        check_len("activations (f32)", self.k * self.n, x.len())?;
        check_len("prepared activations", self.act_bytes(), act.len())?;
        for (src, dst) in x
            .chunks_exact(self.k)
            .zip(act.chunks_exact_mut(self.act_row))
        {
            self.dot.prepare(src, dst);
        }
        Ok(())
    }

    /// `out` (`{m, n}`) `= W · x`, rows split over the pool's threads.
    ///
    /// Errors: [`crate::CodegenError::BufferSize`] on wrong lengths.
    pub fn run(
        &self,
        pool: &crate::ThreadPool,
        w: &[u8],
        act: &[u8],
        out: &mut [f32],
    ) -> crate::Result<()> {
        check_len("weight", self.weight_bytes(), w.len())?;
        check_len("prepared activations", self.act_bytes(), act.len())?;
        check_len("output", self.m * self.n, out.len())?;
        let out_ptr = out.as_mut_ptr() as usize;
        pool.run(&|ti, nt| {
            // Rows split in multiples of 8, as the plans' chunks are.
            let blocks = self.m.div_ceil(8);
            let r0 = (8 * (blocks * ti / nt)).min(self.m);
            let r1 = (8 * (blocks * (ti + 1) / nt)).min(self.m);
            // SAFETY: lengths checked above; `out` stays borrowed until the pool has joined,
            // and threads write disjoint rows.
            unsafe {
                products(
                    &self.dot,
                    w.as_ptr(),
                    self.row_bytes,
                    act.as_ptr(),
                    self.act_row,
                    (self.n, 0, self.n_cols),
                    out_ptr as *mut f32,
                    self.m,
                    (r0, r1),
                    false,
                )
            };
        });
        Ok(())
    }
}

fn check_len(what: &'static str, expected: usize, got: usize) -> crate::Result<()> {
    if expected == got {
        Ok(())
    } else {
        Err(crate::CodegenError::BufferSize {
            what,
            expected,
            got,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// F32, F16 and BF16 weights through [`RowsMatmul`] for 1 to 9 tokens and two row counts:
    /// every output is what `ir::ggml` computes for its column (`ggml_vec_dot_f16` /
    /// `_bf16` for one column, tinyBLAS from two).
    #[test]
    fn half_products_are_llama_cpp_s() {
        let mut s = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s
        };
        let pool = crate::ThreadPool::new(2).expect("threads");
        for t in [GgmlType::F32, GgmlType::F16, GgmlType::BF16] {
            for (k, m) in [(576usize, 12usize), (96, 20)] {
                let wf: Vec<f32> = (0..k * m)
                    .map(|_| (next() % 4001) as f32 / 1000.0 - 2.0)
                    .collect();
                let rb = t.type_size() * k;
                let mut w = vec![0u8; rb * m];
                ggml::quantize(t, &wf, &mut w, Q8Flavor::X86).expect("converts");
                for n in 1..=9usize {
                    let x: Vec<f32> = (0..k * n)
                        .map(|_| (next() % 2001) as f32 / 100.0 - 10.0)
                        .collect();
                    let mm = RowsMatmul::new(t, k, m, n).expect("row-dot kernels");
                    assert!(mm.exact());
                    let mut act = vec![0u8; mm.act_bytes()];
                    mm.prepare(&x, &mut act).expect("prepares");
                    let mut out = vec![0f32; m * n];
                    mm.run(&pool, &w, &act, &mut out).expect("runs");
                    for c in 0..n {
                        let (_, a) =
                            ggml::quantize_activations(t, &x[c * k..(c + 1) * k], Q8Flavor::X86)
                                .expect("converts");
                        for r in 0..m {
                            let want =
                                ggml::vec_dot_avx2_mul_mat(t, &w[rb * r..rb * (r + 1)], &a, n)
                                    .expect("product");
                            let got = out[c * m + r];
                            assert_eq!(
                                got.to_bits(),
                                want.to_bits(),
                                "{} k {k} m {m}, {n} tokens, row {r} column {c}: {got} vs {want}",
                                t.name()
                            );
                        }
                    }
                }
            }
        }
    }

    /// The types with packed tiles through [`RowsMatmul`] for 1 to 40 tokens (whole and
    /// partial groups of eight and sixteen) and row counts with and without a multiple of
    /// eight: every output is what `ir::ggml` computes for its column (the repacked gemm /
    /// gemv orders of Q4_0, IQ4_NL and Q4_K, the tiled K-quant order of Q2_K / Q3_K / Q5_K /
    /// Q6_K / IQ4_XS from 8 columns, tinyBLAS's of the float types (F16 and BF16 rows
    /// widened to f32 for the packed tile), the `vec_dot` order of the others).
    #[test]
    fn packed_products_are_llama_cpp_s() {
        let mut s = 0x51ed_270b_u64;
        let mut next = move || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s
        };
        let pool = crate::ThreadPool::new(2).expect("threads");
        let types = [
            GgmlType::Q4_0,
            GgmlType::IQ4_NL,
            GgmlType::Q4_K,
            GgmlType::Q2_K,
            GgmlType::Q3_K,
            GgmlType::Q5_K,
            GgmlType::Q6_K,
            GgmlType::IQ4_XS,
            GgmlType::Q8_0,
            GgmlType::Q5_0,
            GgmlType::Q4_1,
            GgmlType::Q5_1,
            GgmlType::F32,
            GgmlType::F16,
            GgmlType::BF16,
        ];
        for t in types {
            let k = 512;
            for m in [24usize, 20] {
                let rb = t.row_size(k as u64).expect("whole blocks") as usize;
                // Random blocks with moderate f16 scales (d, and m / dmin where the type
                // has one); Q8_0 quants in -127..=127, as ggml's quantizer writes them.
                let mut w: Vec<u8> = (0..rb * m).map(|_| next() as u8).collect();
                // Float weights: values in [-1, 1] (random bytes would be NaNs and
                // subnormals).
                let value = |r: u64| (r % 2001) as f32 / 1000.0 - 1.0;
                match t {
                    GgmlType::F32 => {
                        w = (0..k * m)
                            .flat_map(|_| value(next()).to_le_bytes())
                            .collect()
                    }
                    GgmlType::F16 => {
                        w = (0..k * m)
                            .flat_map(|_| half::f16::from_f32(value(next())).to_le_bytes())
                            .collect()
                    }
                    GgmlType::BF16 => {
                        w = (0..k * m)
                            .flat_map(|_| half::bf16::from_f32(value(next())).to_le_bytes())
                            .collect()
                    }
                    _ => {}
                }
                let ts = t.type_size();
                let f16s = f16_scale_offsets(t);
                for blk in w.chunks_exact_mut(ts).filter(|_| t.block_size() > 1) {
                    for &o in &f16s {
                        let v = half::f16::from_f32((next() % 1000) as f32 / 20000.0 - 0.02);
                        blk[o..o + 2].copy_from_slice(&v.to_le_bytes());
                    }
                    if t == GgmlType::Q8_0 {
                        for q in &mut blk[2..] {
                            if *q == 0x80 {
                                *q = 0x81;
                            }
                        }
                    }
                }
                let repacked = ggml::repacked_by_llama_cpp(t, [k as u64, m as u64, 1, 1]);
                // Prompts (`n` columns), then batched decode (`n` one-column products).
                let sizes = [1usize, 4, 8, 9, 13, 16, 21, 40];
                for (n, batched) in sizes
                    .iter()
                    .map(|&n| (n, false))
                    .chain([8usize, 9, 16, 21].iter().map(|&n| (n, true)))
                {
                    let n_cols = if batched { 1 } else { n };
                    let x: Vec<f32> = (0..k * n)
                        .map(|_| (next() % 2001) as f32 / 100.0 - 10.0)
                        .collect();
                    let mm = RowsMatmul::new(t, k, m, n).expect("row-dot kernels");
                    let mm = if batched { mm.batched() } else { mm };
                    let mut act = vec![0u8; mm.act_bytes()];
                    mm.prepare(&x, &mut act).expect("prepares");
                    let mut out = vec![0f32; m * n];
                    mm.run(&pool, &w, &act, &mut out).expect("runs");
                    for c in 0..n {
                        let (_, a) =
                            ggml::quantize_activations(t, &x[c * k..(c + 1) * k], Q8Flavor::X86)
                                .expect("quantizes");
                        for r in 0..m {
                            let row = &w[rb * r..rb * (r + 1)];
                            let col = if batched { 0 } else { c };
                            let want = if repacked {
                                ggml::RepackedRow::new(t, row)
                                    .and_then(|p| p.dot(&a, RepackKernel::for_column(col, n_cols)))
                            } else {
                                ggml::vec_dot_avx2_mul_mat(t, row, &a, n_cols)
                            }
                            .expect("product");
                            let got = out[c * m + r];
                            assert_eq!(
                                got.to_bits(),
                                want.to_bits(),
                                "{} m {m}, {n} tokens (batched {batched}), row {r} column {c}: {got} vs {want}",
                                t.name()
                            );
                        }
                    }
                }
            }
        }
    }

    /// `--kernels fast` for Q4_K where the host has the sixteen-row AMX form: every column
    /// of a prompt gets llama.cpp's repacked gemv numbers (its decode kernel's), bit for bit.
    #[test]
    fn fast_q4_k_products_are_llama_cpp_s_gemv() {
        let t = GgmlType::Q4_K;
        let (k, m, n) = (768usize, 40usize, 37usize);
        let mm = RowsMatmul::new(t, k, m, n).expect("row-dot kernels");
        let Some(mm) = mm.block_order() else {
            eprintln!("no fast Q4_K form on this host");
            return;
        };
        assert!(!mm.exact());
        let mut s = 0x7a3f_11c9_u64;
        let mut next = move || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s
        };
        let rb = t.row_size(k as u64).expect("whole blocks") as usize;
        let mut w: Vec<u8> = (0..rb * m).map(|_| next() as u8).collect();
        for blk in w.chunks_exact_mut(t.type_size()) {
            for o in [0, 2] {
                let v = half::f16::from_f32((next() % 1000) as f32 / 20000.0 - 0.02);
                blk[o..o + 2].copy_from_slice(&v.to_le_bytes());
            }
        }
        let x: Vec<f32> = (0..k * n)
            .map(|_| (next() % 2001) as f32 / 100.0 - 10.0)
            .collect();
        let pool = crate::ThreadPool::new(2).expect("threads");
        let mut act = vec![0u8; mm.act_bytes()];
        mm.prepare(&x, &mut act).expect("prepares");
        let mut out = vec![0f32; m * n];
        mm.run(&pool, &w, &act, &mut out).expect("runs");
        for c in 0..n {
            let (_, a) = ggml::quantize_activations(t, &x[c * k..(c + 1) * k], Q8Flavor::X86)
                .expect("quantizes");
            for r in 0..m {
                let want = ggml::RepackedRow::new(t, &w[rb * r..rb * (r + 1)])
                    .and_then(|p| p.dot(&a, RepackKernel::Gemv))
                    .expect("product");
                let got = out[c * m + r];
                assert_eq!(
                    got.to_bits(),
                    want.to_bits(),
                    "row {r} column {c}: {got} vs {want}"
                );
            }
        }
    }

    /// MXFP4 weights through [`RowsMatmul`], repacked by llama.cpp (`m % 8 == 0`: the
    /// interleaved gemv / gemm order) and not (`ggml_vec_dot_mxfp4_q8_0`'s order), for 1, 5
    /// and 9 tokens (gemv only; gemm and gemv; gemm for 8 and gemv for 1): every output is
    /// what `ir::ggml` computes for it, which `ir/tests/ggml_vectors.rs` checks against
    /// llama.cpp's library.
    #[test]
    fn mxfp4_products_are_llama_cpp_s() {
        let t = GgmlType::MXFP4;
        let k = 256;
        let mut s = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s
        };
        let pool = crate::ThreadPool::new(2).expect("threads");
        let row = t.row_size(k as u64).expect("whole blocks") as usize;
        for m in [12usize, 16] {
            let mut w: Vec<u8> = (0..row * m).map(|_| next() as u8).collect();
            for blk in w.chunks_exact_mut(t.type_size()) {
                blk[0] = 118 + (next() % 12) as u8; // scales 2^-10 .. 2
            }
            for n in [1usize, 5, 9] {
                let x: Vec<f32> = (0..k * n)
                    .map(|_| (next() % 2001) as f32 / 1000.0 - 1.0)
                    .collect();
                let mm = RowsMatmul::new(t, k, m, n).expect("MXFP4 has row-dot kernels");
                assert!(mm.exact() && mm.simd() == Tier::host().isa().is_some());
                let mut act = vec![0u8; mm.act_bytes()];
                mm.prepare(&x, &mut act).expect("prepares");
                let mut out = vec![0f32; m * n];
                mm.run(&pool, &w, &act, &mut out).expect("runs");
                for c in 0..n {
                    let xc = &x[c * k..(c + 1) * k];
                    for r in 0..m {
                        let wr = &w[r * row..(r + 1) * row];
                        let want = if m % 8 == 0 {
                            let kernel = RepackKernel::for_column(c, n);
                            let (_, a) = ggml::repack_quantize_activations(t, xc, kernel)
                                .expect("quantizes");
                            ggml::RepackedRow::new(t, wr)
                                .and_then(|rr| rr.dot(&a, kernel))
                                .expect("repacked product")
                        } else {
                            let (_, a) = ggml::quantize_activations(t, xc, Q8Flavor::X86)
                                .expect("quantizes");
                            ggml::vec_dot_avx2_mul_mat(t, wr, &a, n).expect("product")
                        };
                        let got = out[c * m + r];
                        assert_eq!(
                            got.to_bits(),
                            want.to_bits(),
                            "m {m}, {n} tokens, row {r} column {c}: {got} vs {want}"
                        );
                    }
                }
            }
        }
    }
}
