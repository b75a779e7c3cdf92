//! Lowering: each kernel of a plan step becomes an [`Op`] whose operands are raw pointers
//! into the arena, the KV caches and the weights, with every shape and stride checked once
//! here so the ops can run unchecked.
//!
//! Weights: matmul weights are repacked into the kernels' layout (one copy per tensor, shared
//! by every step that uses it); the embedding table of `get_rows` is read in place from the
//! file (zero-copy); small f32 vectors used elementwise (norm weights, biases, rope frequency
//! factors) are copied into aligned memory.

use std::collections::HashMap;
use std::sync::Arc;

use ir::ggml::GgmlType;
use ir::graph::{DType, Input, Op as IrOp, RopeParams};
use ir::interp::WeightSource;
use ir::plan::{
    Base, Epilogue, Kernel, KernelOp, MulMatSpec as PlanMulMat, Plan, RopeKvStoreSpec, Step,
    ValueId, WeightId,
};

use super::mul_mat::{chunk_groups, Epi, Mat, MatWeight, MulMat, Out, Prep};
use super::ops::{Attention, CacheRows, GetRows, Op, RopeKv, Table};
use super::view::{Ptr, View};
use super::ExecError;
use crate::actq::act_row_bytes;
use crate::formats::QuantFormat;
use crate::generated::SumOrder;
use crate::handwritten::actq::FastQuant;
use crate::handwritten::elementwise::{Binary, Glu, Unary};
use crate::handwritten::rope::RopeTable;
use crate::layout::{repack, supports, RepackedWeight};
use crate::matmul::MatmulSpec;
use crate::rows::RowDot;
use crate::select::{MatFamily, MatKernel};

/// Sizes of the scratch buffers the lowered ops need.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Needs {
    /// f32 values per thread.
    pub tmp_floats: usize,
    /// Attention scores per thread.
    pub score_floats: usize,
    /// Multi-token attention scratch per thread.
    pub attn_floats: usize,
    /// Prepared activations per thread (unsplit preparation).
    pub act_private_bytes: usize,
    /// Shared prepared activations (split preparation).
    pub act_shared_bytes: usize,
    /// Epilogue products.
    pub epi_bytes: usize,
}

/// The weights as the ops read them; owns the copies.
pub(crate) struct WeightStore<'w> {
    src: &'w dyn WeightSource,
    raw: HashMap<WeightId, &'w [u8]>,
    f32s: HashMap<WeightId, Vec<f32>>,
    repacked: HashMap<WeightId, Arc<RepackedWeight>>,
    /// Seconds spent repacking.
    pub repack_seconds: f64,
    /// Bytes of repacked copies.
    pub repacked_bytes: usize,
}

impl<'w> WeightStore<'w> {
    pub fn new(src: &'w dyn WeightSource) -> WeightStore<'w> {
        WeightStore {
            src,
            raw: HashMap::new(),
            f32s: HashMap::new(),
            repacked: HashMap::new(),
            repack_seconds: 0.0,
            repacked_bytes: 0,
        }
    }
}

/// One matmul kernel to generate.
pub(crate) type SpecTable = Vec<MatmulSpec>;

/// The state of a lowering.
pub(crate) struct Lowerer<'p, 'w, 's> {
    pub plan: &'p Plan,
    pub store: &'s mut WeightStore<'w>,
    pub arena: Ptr,
    pub arena_bytes: usize,
    /// Null: a KV view's pointer is its offset in a sequence's KV memory (each op that
    /// reads or writes a cache rebases it on the memory of its step).
    pub kv: Ptr,
    /// Byte offset of each KV cache in a sequence's KV memory, and its size at the plan's
    /// `n_ctx`.
    pub kv_ranges: Vec<(usize, usize)>,
    /// Cells of each KV cache in a sequence's KV memory where it is a ring shorter than the
    /// context (position `p` in cell `p % cells`; [`ir::plan::KvLayout`]); empty or
    /// `usize::MAX`: cell `p` holds position `p`.
    pub kv_cells: Vec<usize>,
    /// Whether the operand being lowered may be a KV cache (only cache stores and
    /// attention rebase their views on the step's KV memory).
    kv_ok: bool,
    pub n_threads: usize,
    /// The sum order of the products (`--kernels`).
    pub order: SumOrder,
    pub needs: Needs,
    pub specs: SpecTable,
    /// Whether some activation quantizer fell back to the scalar reference.
    pub slow_quant: bool,
    spec_index: HashMap<MatmulSpec, usize>,
    ropes: HashMap<(String, Option<WeightId>), Arc<RopeTable>>,
    /// The values of the step being lowered that hold only the rows that produce logits
    /// ([`Lowerer::begin_step`]).
    output_rows: std::collections::HashSet<ValueId>,
}

fn bad(s: &Step, k: &Kernel, msg: impl std::fmt::Display) -> ExecError {
    ExecError::Kernel {
        n_tokens: s.n_tokens,
        kernel: k.name.clone(),
        msg: msg.to_string(),
    }
}

impl<'p, 'w, 's> Lowerer<'p, 'w, 's> {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        plan: &'p Plan,
        store: &'s mut WeightStore<'w>,
        arena: Ptr,
        arena_bytes: usize,
        kv: Ptr,
        kv_ranges: Vec<(usize, usize)>,
        n_threads: usize,
    ) -> Self {
        Lowerer {
            plan,
            store,
            arena,
            arena_bytes,
            kv,
            kv_ranges,
            kv_cells: Vec::new(),
            kv_ok: false,
            n_threads,
            order: SumOrder::Ggml,
            needs: Needs::default(),
            specs: Vec::new(),
            slow_quant: false,
            spec_index: HashMap::new(),
            ropes: HashMap::new(),
            output_rows: std::collections::HashSet::new(),
        }
    }

    /// The file bytes of weight `id`, checked against the plan's type and shape.
    pub(crate) fn raw(&mut self, id: WeightId) -> Result<&'w [u8], String> {
        if let Some(d) = self.store.raw.get(&id) {
            return Ok(d);
        }
        let w = self
            .plan
            .weights
            .get(id.index())
            .ok_or_else(|| format!("weight id {} is not in the plan", id.0))?;
        let src: &'w dyn WeightSource = self.store.src;
        let r = src
            .weight(&w.name)
            .ok_or_else(|| format!("weight {} is not in the model file", w.name))?;
        if r.ggml_type != w.dtype.ggml_type() || r.ne != w.shape.ne {
            return Err(format!(
                "weight {}: the plan expects {} {}, the file has {} {:?}",
                w.name,
                w.dtype,
                w.shape,
                r.ggml_type.name(),
                r.ne
            ));
        }
        let want = w
            .bytes()
            .ok_or_else(|| format!("weight {} has no whole number of blocks", w.name))?;
        if r.data.len() as u64 != want {
            return Err(format!(
                "weight {}: {} bytes of data, expected {want}",
                w.name,
                r.data.len()
            ));
        }
        self.store.raw.insert(id, r.data);
        Ok(r.data)
    }

    /// An f32 copy of weight `id` (F32 weights only).
    fn weight_f32(&mut self, id: WeightId) -> Result<Ptr, String> {
        if let Some(v) = self.store.f32s.get(&id) {
            return Ok(Ptr(v.as_ptr() as *mut u8));
        }
        let w = &self.plan.weights[id.index()];
        if w.dtype != DType::F32 {
            return Err(format!(
                "weight {} is {}: elementwise operands must be F32",
                w.name, w.dtype
            ));
        }
        let data = self.raw(id)?;
        let v: Vec<f32> = data
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        let p = Ptr(v.as_ptr() as *mut u8);
        self.store.f32s.insert(id, v);
        Ok(p)
    }

    /// Weight `id` read in place by the row-dot kernels ([`crate::rows`]) of the family
    /// and level `choice` names, with the input preparation they need; `k` is the input's
    /// row length.
    fn rows_weight(
        &mut self,
        id: WeightId,
        k: usize,
        choice: MatKernel,
    ) -> Result<(Prep, MatWeight), String> {
        let w = self.plan.weights[id.index()].clone();
        let t = w.dtype.ggml_type();
        let dot = match choice.family {
            MatFamily::Rows => RowDot::new(t, choice.tier),
            MatFamily::Repacked => RowDot::for_weight(t, w.shape.ne, choice.tier),
            MatFamily::Block => RowDot::for_weight_block(t, choice.tier),
            MatFamily::Generated => None,
        }
        .map(|d| d.with_prefetch(choice.prefetch))
        .ok_or_else(|| {
            format!(
                "weight {} is {}: no CPU matmul kernel for this type yet",
                w.name,
                t.name()
            )
        })?;
        if w.shape.ne[2] != 1 || w.shape.ne[3] != 1 {
            return Err(format!("weight {} {} is not a matrix", w.name, w.shape));
        }
        let (row_bytes, _) = dot.row_bytes(k).zip(dot.act_row_bytes(k)).ok_or_else(|| {
            format!(
                "weight {}: {k} values are not whole {} blocks",
                w.name,
                t.name()
            )
        })?;
        let data = self.raw(id)?;
        Ok((
            Prep::Rows(dot),
            MatWeight::Rows {
                dot,
                data: Ptr(data.as_ptr() as *mut u8),
                row_bytes,
            },
        ))
    }

    /// Weight `id` repacked for the matmul kernels.
    fn repacked(&mut self, id: WeightId) -> Result<Arc<RepackedWeight>, String> {
        if let Some(r) = self.store.repacked.get(&id) {
            return Ok(r.clone());
        }
        let w = self.plan.weights[id.index()].clone();
        let t = w.dtype.ggml_type();
        if !supports(t) {
            return Err(format!(
                "weight {} is {}: no CPU matmul kernel for this type yet",
                w.name,
                t.name()
            ));
        }
        if w.shape.ne[2] != 1 || w.shape.ne[3] != 1 {
            return Err(format!("weight {} {} is not a matrix", w.name, w.shape));
        }
        let data = self.raw(id)?;
        let t0 = std::time::Instant::now();
        let r = repack(t, w.shape.ne[0] as usize, w.shape.ne[1] as usize, data)
            .map_err(|e| format!("repacking {}: {e}", w.name))?;
        self.store.repack_seconds += t0.elapsed().as_secs_f64();
        self.store.repacked_bytes += r.bytes();
        let r = Arc::new(r);
        self.store.repacked.insert(id, r.clone());
        Ok(r)
    }

    /// The view of value `id` of step `s`, bounds-checked against its buffer.
    pub fn view(&mut self, s: &Step, id: ValueId) -> Result<View, String> {
        let v = s
            .values
            .get(id.index())
            .ok_or_else(|| format!("value id {} is not in the step", id.0))?;
        let end = v
            .end()
            .ok_or_else(|| format!("value {} has no valid extent", v.name))?;
        let (ptr, limit) = match v.base {
            Base::Arena(b) => {
                let buf = &s.buffers[b.index()];
                let off = buf.offset.ok_or_else(|| {
                    format!(
                        "buffer {} has no arena offset (plan not memory-planned)",
                        buf.name
                    )
                })?;
                if off + buf.bytes > self.arena_bytes as u64 {
                    return Err(format!("buffer {} ends past the arena", buf.name));
                }
                (self.arena.add(off as usize), buf.bytes)
            }
            Base::Kv(k) => {
                if !self.kv_ok {
                    return Err(format!(
                        "value {} is a KV cache: only cache stores and attention read or write one",
                        v.name
                    ));
                }
                let &(off, bytes) = self
                    .kv_ranges
                    .get(k.index())
                    .ok_or_else(|| format!("KV cache id {} is not in the plan", k.0))?;
                (self.kv.add(off), bytes as u64)
            }
            Base::Weight(w) => {
                let p = self.weight_f32(w)?;
                (p.0, self.store.f32s[&w].len() as u64 * 4)
            }
        };
        if end > limit {
            return Err(format!(
                "value {} reaches byte {end} of a {limit}-byte buffer",
                v.name
            ));
        }
        let cast = |a: [u64; 4]| a.map(|x| x as usize);
        Ok(View {
            ptr: Ptr(ptr.wrapping_add(v.offset as usize)),
            ne: cast(v.shape.ne),
            nb: cast(v.nb),
            kv: v.shape.kv,
            dtype: v.dtype,
        })
    }

    /// A view of a KV cache (its pointer an offset: see [`Lowerer::kv`]).
    /// The ring cells of the KV cache value `id` is a view of ([`Lowerer::kv_cells`]).
    fn ring_cells(&self, s: &Step, id: ValueId) -> usize {
        match s.values[id.index()].base {
            Base::Kv(k) => self.kv_cells.get(k.index()).copied().unwrap_or(usize::MAX),
            _ => usize::MAX,
        }
    }

    fn kv_view(&mut self, s: &Step, id: ValueId) -> Result<View, String> {
        if !matches!(s.values[id.index()].base, Base::Kv(_)) {
            return Err(format!("{} must be a KV cache", s.values[id.index()].name));
        }
        self.kv_ok = true;
        let v = self.view(s, id);
        self.kv_ok = false;
        v
    }

    /// A view that must be f32 with contiguous rows.
    pub(crate) fn f32_view(&mut self, s: &Step, id: ValueId) -> Result<View, String> {
        let v = self.view(s, id)?;
        if v.dtype != DType::F32 || !v.rows_contiguous() {
            return Err(format!(
                "{} must be F32 with contiguous rows",
                s.values[id.index()].name
            ));
        }
        Ok(v)
    }

    /// The positions input of the step, which `pos` must be (positions are checked before
    /// each step, so kernels index the caches with them unchecked).
    fn positions(&mut self, s: &Step, pos: ValueId) -> Result<Ptr, String> {
        let want = s
            .input(&Input::Positions)
            .ok_or("the step has no positions input")?;
        if !s.values[pos.index()].same_view(&s.values[want.index()]) {
            return Err("positions must be the step's positions input".into());
        }
        Ok(self.view(s, pos)?.ptr)
    }

    fn rope_table(
        &mut self,
        p: &RopeParams,
        ff: Option<WeightId>,
    ) -> Result<Arc<RopeTable>, String> {
        let key = (format!("{p:?}"), ff);
        if let Some(t) = self.ropes.get(&key) {
            return Ok(t.clone());
        }
        if p.n_rot == 0 || !p.n_rot.is_multiple_of(2) {
            return Err(format!(
                "rope n_rot = {} (must be even and positive)",
                p.n_rot
            ));
        }
        let factors = match ff {
            Some(id) => {
                let ptr = self.weight_f32(id)?;
                let n = self.store.f32s[&id].len();
                if n < (p.n_rot / 2) as usize {
                    return Err(format!(
                        "rope frequency factors: {n} values, need {}",
                        p.n_rot / 2
                    ));
                }
                // SAFETY: the copy holds `n` f32 values and lives in the store.
                Some(unsafe { std::slice::from_raw_parts(ptr.0 as *const f32, n) })
            }
            None => None,
        };
        let t = Arc::new(RopeTable::new(p, factors, self.plan.n_ctx as usize));
        self.ropes.insert(key, t.clone());
        Ok(t)
    }

    fn spec(&mut self, spec: MatmulSpec) -> usize {
        if let Some(&i) = self.spec_index.get(&spec) {
            return i;
        }
        self.specs.push(spec);
        self.spec_index.insert(spec, self.specs.len() - 1);
        self.specs.len() - 1
    }

    /// Lowers kernel `k` of step `s` into one or more ops.
    pub fn kernel(&mut self, s: &Step, k: &Kernel) -> Result<Vec<Op>, ExecError> {
        self.kernel_inner(s, k).map_err(|m| bad(s, k, m))
    }

    /// Starts lowering step `s`: finds the values that hold only the rows that produce
    /// logits, those computed from the rows `inp_out_ids` selects (llama.cpp's last layer
    /// after `ggml_get_rows(cur, inp_out_ids)`, the output norm, the head).
    /// Whether every result of kernel `k` of the current step is an output-row value (it
    /// follows `get_rows(inp_out_ids)`: it only serves the logits).
    pub fn only_output_rows(&self, k: &Kernel) -> bool {
        !k.dsts.is_empty() && k.dsts.iter().all(|d| self.output_rows.contains(d))
    }

    pub fn begin_step(&mut self, s: &Step) {
        self.output_rows = crate::select::output_rows(s);
    }

    fn kernel_inner(&mut self, s: &Step, k: &Kernel) -> Result<Vec<Op>, String> {
        let ((lo, hi), nd) = k.op.arity();
        if k.srcs.len() < lo || k.srcs.len() > hi || k.dsts.len() != nd {
            return Err(format!(
                "{} takes {lo}..={hi} sources and {nd} results",
                k.op.name()
            ));
        }
        let src = &k.srcs;
        let dst = k.dsts[0];
        Ok(match &k.op {
            KernelOp::MulMat(spec) => return self.mul_mat(s, k, spec, &k.srcs),
            KernelOp::RopeKvStore(r) => vec![self.rope_kv_store(s, k, r)?],
            KernelOp::RmsNormMul { eps } => {
                let x = self.f32_view(s, src[0])?;
                let w = self.f32_view(s, src[1])?;
                let y = self.f32_view(s, dst)?;
                self.needs.tmp_floats = self.needs.tmp_floats.max(y.ne[0]);
                vec![Op::Norm {
                    x,
                    w: Some(w),
                    y,
                    rms: true,
                    eps: *eps,
                }]
            }
            KernelOp::Op(op) => match op {
                IrOp::MulMat => {
                    let spec = PlanMulMat {
                        norm: None,
                        n_mat: 1,
                        epilogue: Epilogue::None,
                    };
                    return self.mul_mat(s, k, &spec, &[src[1], src[0]]);
                }
                IrOp::GetRows => vec![self.get_rows(s, src[0], src[1], dst)?],
                IrOp::RmsNorm { eps } | IrOp::Norm { eps } => {
                    let x = self.f32_view(s, src[0])?;
                    let y = self.f32_view(s, dst)?;
                    let rms = matches!(op, IrOp::RmsNorm { .. });
                    vec![Op::Norm {
                        x,
                        w: None,
                        y,
                        rms,
                        eps: *eps,
                    }]
                }
                IrOp::Add | IrOp::Mul => {
                    let a = self.f32_view(s, src[0])?;
                    let b = self.f32_view(s, src[1])?;
                    let y = self.f32_view(s, dst)?;
                    if b.ne[0] == 0 || b.kv != 0 && b.kv != y.kv {
                        return Err("the second source cannot be repeated over the first".into());
                    }
                    let f = if matches!(op, IrOp::Add) {
                        Binary::Add
                    } else {
                        Binary::Mul
                    };
                    vec![Op::Binary { a, b, y, f }]
                }
                IrOp::Scale { .. }
                | IrOp::Hadamard { .. }
                | IrOp::Silu
                | IrOp::Gelu
                | IrOp::Tanh
                | IrOp::SoftCap { .. }
                | IrOp::Cont => {
                    let x = self.view(s, src[0])?;
                    if x.dtype != DType::F32 {
                        return Err("the source must be F32".into());
                    }
                    let y = self.f32_view(s, dst)?;
                    let f = match op {
                        IrOp::Scale { s } => Unary::Scale(*s),
                        IrOp::Hadamard { n } => Unary::Hadamard(*n),
                        IrOp::Silu => Unary::Silu,
                        IrOp::Gelu => Unary::Gelu,
                        IrOp::Tanh => Unary::Tanh,
                        IrOp::SoftCap { cap } => Unary::SoftCap(*cap),
                        _ => Unary::Copy,
                    };
                    if f != Unary::Copy && x.nb[0] != 4 {
                        return Err("the source must have contiguous rows".into());
                    }
                    vec![Op::Unary { x, y, f }]
                }
                IrOp::Swiglu | IrOp::Geglu => {
                    let g = self.f32_view(s, src[0])?;
                    let u = self.f32_view(s, src[1])?;
                    let y = self.f32_view(s, dst)?;
                    let f = if matches!(op, IrOp::Swiglu) {
                        Glu::Swiglu
                    } else {
                        Glu::Geglu
                    };
                    vec![Op::Glu { g, u, y, f }]
                }
                IrOp::SoftMax { scale } => {
                    let x = self.f32_view(s, src[0])?;
                    let y = self.f32_view(s, dst)?;
                    vec![Op::SoftMax {
                        x,
                        y,
                        scale: *scale,
                    }]
                }
                IrOp::Rope(p) => {
                    let ff = self.freq_factors(s, src.get(2).copied())?;
                    let table = self.rope_table(p, ff)?;
                    let x = self.f32_view(s, src[0])?;
                    let y = self.f32_view(s, dst)?;
                    self.check_rope_head(&x, p)?;
                    let pos = self.positions(s, src[1])?;
                    self.needs.tmp_floats = self.needs.tmp_floats.max(x.ne[0]);
                    vec![Op::RopeKv(RopeKv {
                        n_tokens: x.ne[2],
                        pos,
                        table: Some(table),
                        k: None,
                        q: Some((x, y)),
                        v: None,
                    })]
                }
                IrOp::KvStore => {
                    let cur = self.f32_view(s, src[1])?;
                    let cache = self.cache_rows(s, dst, cur.ne[0])?;
                    let pos = self.positions(s, src[2])?;
                    vec![Op::RopeKv(RopeKv {
                        n_tokens: cur.ne[1],
                        pos,
                        table: None,
                        k: None,
                        q: None,
                        v: Some((cur, cache)),
                    })]
                }
                IrOp::Attention(p) => vec![self.attention(s, k, *p)?],
                IrOp::TopK { .. } | IrOp::MoeWeights { .. } | IrOp::MulMatId | IrOp::MoeSum => {
                    return super::moe::lower(self, s, k, op)
                }
                other => return Err(format!("no CPU kernel for op {}", other.name())),
            },
        })
    }

    fn freq_factors(&mut self, s: &Step, id: Option<ValueId>) -> Result<Option<WeightId>, String> {
        match id {
            None => Ok(None),
            Some(id) => match s.values[id.index()].base {
                Base::Weight(w) => Ok(Some(w)),
                _ => Err("rope frequency factors must be a weight".into()),
            },
        }
    }

    fn check_rope_head(&self, x: &View, p: &RopeParams) -> Result<(), String> {
        if (p.n_rot as usize) > x.ne[0] {
            return Err(format!(
                "rope n_rot = {} exceeds the head size {}",
                p.n_rot, x.ne[0]
            ));
        }
        if x.kv != 0 || x.ne[3] != 1 {
            return Err("rope source must be {head, n_head, n_tokens}".into());
        }
        Ok(())
    }

    /// Rows of the KV cache value `id` (the whole cache `{width, n_ctx}`), each at least
    /// `width` elements wide.
    fn cache_rows(&mut self, s: &Step, id: ValueId, width: usize) -> Result<CacheRows, String> {
        let v = self.kv_view(s, id)?;
        if !matches!(s.values[id.index()].base, Base::Kv(_)) {
            return Err("the store target must be a KV cache".into());
        }
        let q8 = v.dtype == DType::Block(GgmlType::Q8_0);
        if !matches!(v.dtype, DType::F16 | DType::F32) && !q8 || !v.rows_contiguous() {
            return Err("KV cache must be F16, F32 or Q8_0 with contiguous rows".into());
        }
        if q8 && (width % 32 != 0 || v.ne[0] % 32 != 0) {
            return Err(format!(
                "a Q8_0 KV cache needs rows of whole blocks, not {width}"
            ));
        }
        if v.ne[0] < width || v.ne[1] < self.plan.n_ctx as usize {
            return Err(format!(
                "KV cache {{{}, {}}} cannot hold rows of {width} at {} positions",
                v.ne[0], v.ne[1], self.plan.n_ctx
            ));
        }
        Ok(CacheRows {
            ptr: v.ptr,
            stride: v.nb[1],
            f16: v.dtype == DType::F16,
            q8,
            cells: self.ring_cells(s, id),
        })
    }

    fn get_rows(
        &mut self,
        s: &Step,
        table: ValueId,
        ids: ValueId,
        dst: ValueId,
    ) -> Result<Op, String> {
        let tv = &s.values[table.index()];
        let idv = self.view(s, ids)?;
        if idv.dtype != DType::I32
            || !idv.rows_contiguous()
            || idv.ne[1] * idv.ne[2] * idv.ne[3] != 1
        {
            return Err("ids must be a contiguous I32 vector".into());
        }
        let y = self.f32_view(s, dst)?;
        let ne0 = tv.shape.ne[0] as usize;
        if y.ne[0] != ne0 || y.ne[1] != idv.ne[0] {
            return Err("result shape does not match the table row and the ids".into());
        }
        let table = match tv.base {
            Base::Weight(w) => {
                let t = tv.dtype.ggml_type();
                if tv.offset != 0
                    || !tv.is_contiguous()
                    || tv.shape.ne[2] != 1
                    || tv.shape.ne[3] != 1
                {
                    return Err("the embedding table must be a whole 2-D weight".into());
                }
                if ir::ggml::block_format(t).is_none() {
                    return Err(format!("no dequantizer for {}", t.name()));
                }
                let data = self.raw(w)?;
                let row_bytes =
                    t.row_size(ne0 as u64)
                        .ok_or("table row is not whole blocks")? as usize;
                Table::Weight {
                    data: Ptr(data.as_ptr() as *mut u8),
                    t,
                    row_bytes,
                    n_rows: tv.shape.ne[1] as usize,
                }
            }
            _ => {
                let v = self.view(s, table)?;
                if v.dtype != DType::F32 || v.ne[2] != 1 || v.ne[3] != 1 || v.kv != 0 {
                    return Err("an activation table must be a 2-D F32 value".into());
                }
                Table::F32(v)
            }
        };
        let _ = GgmlType::F32;
        Ok(Op::GetRows(GetRows {
            table,
            ids: idv.ptr,
            n: idv.ne[0],
            ne0,
            dst: y,
        }))
    }

    fn rope_kv_store(&mut self, s: &Step, _k: &Kernel, r: &RopeKvStoreSpec) -> Result<Op, String> {
        let src = &_k.srcs;
        let mut next = 2;
        let ff = if r.freq_factors {
            next += 1;
            self.freq_factors(s, Some(src[2]))?
        } else {
            None
        };
        let table = self.rope_table(&r.rope, ff)?;
        let kx = self.f32_view(s, src[0])?;
        self.check_rope_head(&kx, &r.rope)?;
        let pos = self.positions(s, src[1])?;
        let n_tokens = kx.ne[2];
        let kc = self.cache_rows(s, _k.dsts[0], kx.ne[0] * kx.ne[1])?;
        let mut d = 1;
        let q = if r.q {
            let qx = self.f32_view(s, src[next])?;
            let qy = self.f32_view(s, _k.dsts[d])?;
            self.check_rope_head(&qx, &r.rope)?;
            if qx.ne[2] != n_tokens || qy.ne != qx.ne {
                return Err("Q and its rope result must have K's token count and one shape".into());
            }
            next += 1;
            d += 1;
            Some((qx, qy))
        } else {
            None
        };
        let v = if r.v {
            let vx = self.f32_view(s, src[next])?;
            if vx.ne[1] != n_tokens || vx.ne[2] != 1 {
                return Err("V must be {n_embd_v_gqa, n_tokens}".into());
            }
            let vc = self.cache_rows(s, _k.dsts[d], vx.ne[0])?;
            Some((vx, vc))
        } else {
            None
        };
        self.needs.tmp_floats = self.needs.tmp_floats.max(kx.ne[0]);
        Ok(Op::RopeKv(RopeKv {
            n_tokens,
            pos,
            table: Some(table),
            k: Some((kx, kc)),
            q,
            v,
        }))
    }

    fn attention(
        &mut self,
        s: &Step,
        k: &Kernel,
        params: ir::graph::AttnParams,
    ) -> Result<Op, String> {
        let q = self.f32_view(s, k.srcs[0])?;
        let kc = self.kv_view(s, k.srcs[1])?;
        let vc = self.kv_view(s, k.srcs[2])?;
        let pos = self.positions(s, k.srcs[3])?;
        let out = self.f32_view(s, k.dsts[0])?;
        // F16 or F32 caches of one type, or Q8_0 for either with F16 for the other.
        let fits = super::kv_pair_supported(kc.dtype, vc.dtype);
        if !fits || !kc.rows_contiguous() || !vc.rows_contiguous() {
            return Err(format!(
                "K and V must be views of caches with contiguous rows, both F16 or F32, or Q8_0 \
                 with F16 or Q8_0 (got {} and {})",
                kc.dtype, vc.dtype
            ));
        }
        let (d_k, n_head, n_tokens) = (q.ne[0], q.ne[1], q.ne[2]);
        let (n_head_kv, d_v) = (kc.ne[1], vc.ne[0]);
        if kc.ne[0] != d_k || vc.ne[1] != n_head_kv || n_head_kv == 0 || n_head % n_head_kv != 0 {
            return Err("query, key and value head shapes do not fit".into());
        }
        if kc.kv != 1 << 2 || vc.kv != 1 << 2 || kc.ne[2] != vc.ne[2] || q.kv != 0 {
            return Err(
                "K and V must be {head, n_head_kv, n_kv} with the KV length symbolic".into(),
            );
        }
        if out.ne[0] != d_v || out.ne[1] != n_head || out.ne[2] != n_tokens {
            return Err("the result must be {d_v, n_head, n_tokens}".into());
        }
        self.needs.tmp_floats = self.needs.tmp_floats.max(d_k);
        let (k_cells, v_cells) = (self.ring_cells(s, k.srcs[1]), self.ring_cells(s, k.srcs[2]));
        if k_cells != v_cells
            || (k_cells != usize::MAX && !(params.causal && params.window.is_some()))
        {
            return Err("a ring KV cache needs causal sliding-window attention over K and V rings of one size".into());
        }
        let a = Attention {
            q,
            k: kc,
            v: vc,
            pos,
            out,
            params,
            cells: k_cells,
        };
        self.needs.score_floats = self.needs.score_floats.max(a.query_floats());
        // Single-token steps too: a llama.cpp ubatch of 64 or more tokens cut into steps
        // takes the tiled flash kernel in each of them.
        self.needs.attn_floats = self.needs.attn_floats.max(a.prefill_floats());
        Ok(Op::Attention(a))
    }

    /// A fused matmul; `srcs` in [`ir::plan::MulMatSpec`]'s order. Products whose weights
    /// need different input preparations become one op each (epilogue `None` only).
    fn mul_mat(
        &mut self,
        s: &Step,
        k: &Kernel,
        spec: &PlanMulMat,
        srcs: &[ValueId],
    ) -> Result<Vec<Op>, String> {
        let x = self.f32_view(s, srcs[0])?;
        if x.ne[2] != 1 || x.ne[3] != 1 || x.kv != 0 {
            return Err("the input must be a 2-D f32 value {K, N}".into());
        }
        let (kk, n) = (x.ne[0], x.ne[1]);
        let mut next = 1;
        let norm = match spec.norm {
            Some(eps) => {
                let w = self.f32_view(s, srcs[1])?;
                if w.ne[0] != kk || w.ne[1] * w.ne[2] * w.ne[3] != 1 {
                    return Err("the norm weight must be {K}".into());
                }
                next = 2;
                Some((eps, w.ptr))
            }
            None => None,
        };
        let n_mat = spec.n_mat as usize;
        let choices = crate::select::mat_kernels(k)?;
        if choices.len() != n_mat {
            return Err(format!(
                "{} kernel choices for {n_mat} weights (run select-kernels again)",
                choices.len()
            ));
        }
        let mut mats = Vec::with_capacity(n_mat);
        let mut preps = Vec::with_capacity(n_mat);
        for i in 0..n_mat {
            let wv = &s.values[srcs[next + i].index()];
            let Base::Weight(wid) = wv.base else {
                return Err(format!(
                    "{}: the first operand of a matrix product must be a weight",
                    wv.name
                ));
            };
            if wv.offset != 0 || !wv.is_contiguous() || wv.shape.ne[0] as usize != kk {
                return Err(format!(
                    "{}: must be a whole weight with rows of K = {kk}",
                    wv.name
                ));
            }
            let t = wv.dtype.ggml_type();
            let m = wv.shape.ne[1] as usize;
            let m_pad = m.next_multiple_of(4);
            let name = &self.plan.weights[wid.index()].name;
            // The head, and the last layer's products after llama.cpp keeps only the output
            // rows: their columns are llama.cpp's `n_outputs`, not the ubatch's.
            let lm_head = name == "output.weight"
                || name == "token_embd.weight"
                || self.output_rows.contains(&srcs[0]);
            if choices[i].family != MatFamily::Generated {
                let (prep, weight) = self.rows_weight(wid, kk, choices[i])?;
                preps.push(prep);
                mats.push(Mat {
                    entry: None,
                    spec: usize::MAX,
                    weight,
                    m,
                    m_pad,
                    dst: None,
                    scratch: 0,
                    lm_head,
                    prefetch: choices[i].prefetch,
                });
                continue;
            }
            let rw = self.repacked(wid)?;
            let ms = MatmulSpec {
                wtype: t,
                k: kk,
                m: m_pad,
                n,
            };
            ms.validate().map_err(|e| e.to_string())?;
            let spec_i = self.spec(ms);
            preps.push(match QuantFormat::of(t) {
                Some(f) => {
                    let q = FastQuant::new(f);
                    self.slow_quant |= !q.is_fast();
                    Prep::Quant(q)
                }
                None => match t {
                    GgmlType::F16 => Prep::F16,
                    GgmlType::BF16 => Prep::BF16,
                    _ => Prep::F32,
                },
            });
            mats.push(Mat {
                entry: None,
                spec: spec_i,
                weight: MatWeight::Repacked(rw),
                m,
                m_pad,
                dst: None,
                scratch: 0,
                lm_head,
                prefetch: choices[i].prefetch,
            });
        }
        let epi_src = next + n_mat;
        let out = |v: View| Out {
            ptr: v.ptr,
            stride: v.nb[1],
        };
        let epi = match spec.epilogue {
            Epilogue::None => {
                for (i, mat) in mats.iter_mut().enumerate() {
                    let y = self.f32_view(s, k.dsts[i])?;
                    if y.ne[0] != mat.m || y.ne[1] != n || y.ne[2] * y.ne[3] != 1 {
                        return Err(format!("result {i} must be a {{{}, {n}}} value", mat.m));
                    }
                    mat.dst = Some(out(y));
                }
                Epi::None
            }
            Epilogue::Add => {
                let r = self.f32_view(s, srcs[epi_src])?;
                let y = self.f32_view(s, k.dsts[0])?;
                let m = mats[0].m;
                if r.ne[0] != m
                    || (r.ne[1] != 1 && r.ne[1] != n)
                    || r.ne[2] * r.ne[3] != 1
                    || r.kv != 0
                {
                    return Err("the added value must be {M} or {M, N}".into());
                }
                if y.ne[0] != m || y.ne[1] != n || y.ne[2] * y.ne[3] != 1 {
                    return Err("the result must be {M, N}".into());
                }
                Epi::Add { r, dst: out(y) }
            }
            Epilogue::Swiglu | Epilogue::Geglu => {
                let y = self.f32_view(s, k.dsts[0])?;
                let m = mats[0].m;
                if mats[1].m != m || y.ne[0] != m || y.ne[1] != n || y.ne[2] * y.ne[3] != 1 {
                    return Err("gate, up and result must all have M rows and N tokens".into());
                }
                let f = if spec.epilogue == Epilogue::Swiglu {
                    Glu::Swiglu
                } else {
                    Glu::Geglu
                };
                Epi::Glu { f, dst: out(y) }
            }
        };
        // One op per distinct input preparation.
        let same = |a: &Prep, b: &Prep| {
            std::mem::discriminant(a) == std::mem::discriminant(b)
                && match (a, b) {
                    (Prep::Quant(x), Prep::Quant(y)) => {
                        x.format().act == y.format().act
                            && x.format().zero_point == y.format().zero_point
                    }
                    (Prep::Rows(x), Prep::Rows(y)) => x.act_type() == y.act_type(),
                    _ => true,
                }
        };
        if preps.iter().any(|p| !same(p, &preps[0])) {
            if !matches!(epi, Epi::None) {
                return Err("the weights of a fused epilogue need different input formats".into());
            }
            let mut ops = Vec::new();
            for (mat, prep) in mats.into_iter().zip(preps) {
                ops.push(self.mul_mat_op(x, kk, n, norm, prep, vec![mat], Epi::None));
            }
            return Ok(ops);
        }
        let prep = preps[0];
        Ok(vec![self.mul_mat_op(x, kk, n, norm, prep, mats, epi)])
    }

    #[allow(clippy::too_many_arguments)]
    fn mul_mat_op(
        &mut self,
        x: View,
        k: usize,
        n: usize,
        norm: Option<(f32, Ptr)>,
        prep: Prep,
        mut mats: Vec<Mat>,
        epi: Epi,
    ) -> Op {
        let arb = match prep {
            Prep::Quant(_) => act_row_bytes(k),
            Prep::Rows(r) => r.act_row_bytes(k).unwrap_or(0),
            _ => 4 * k,
        };
        let split_prep = self.n_threads > 1 && n >= 2 * self.n_threads;
        let bytes = arb * n;
        if split_prep {
            self.needs.act_shared_bytes = self.needs.act_shared_bytes.max(bytes);
        } else {
            self.needs.act_private_bytes = self.needs.act_private_bytes.max(bytes);
        }
        self.needs.tmp_floats = self.needs.tmp_floats.max(k);
        // Scratch for the products that do not go straight to their result.
        let mut e = 0;
        for m in &mut mats {
            let direct = matches!(epi, Epi::None)
                && m.m == m.m_pad
                && m.dst.is_some_and(|d| d.stride == 4 * m.m);
            if !direct {
                m.scratch = e;
                e += 4 * m.m_pad * n;
            }
        }
        self.needs.epi_bytes = self.needs.epi_bytes.max(e);
        let epilogue = !matches!(epi, Epi::None);
        let total = if epilogue {
            mats[0].m_pad / 4
        } else {
            mats.iter().map(|m| m.m_pad / 4).sum()
        };
        let chunk_groups = chunk_groups(total, n, self.n_threads, epilogue);
        let lm_head = mats.iter().any(|m| m.lm_head);
        Op::MulMat(Box::new(MulMat {
            k,
            n,
            x,
            norm,
            prep,
            act_row_bytes: arb,
            split_prep,
            mats,
            epi,
            chunk_groups,
            lm_head,
        }))
    }
}
