//! The interpreter proper: binds a graph's inputs, runs its nodes in order, keeps the KV
//! caches between runs.

use super::attention::{attention, kv_store, round_f16, AttnArgs, AttnCfg, AttnMode};
use super::avx2;
use super::elementwise::{
    binary, gelu, gelu_f16_table, glu, map_rows, norm_row, rms_norm_row, silu, soft_max_row, unary,
};
use super::layout::{copy_to, permute, view, Lay};
use super::matmul::{mul_mat, MatA, MatOpts};
use super::qdot::Order;
use super::rope::rope;
use super::weights::WeightSource;
use super::{InterpError, InterpOptions};
use crate::ggml::{self, GgmlType};
use crate::graph::{DType, Def, Graph, Input, Op, Shape, Tensor, TensorId};
use std::borrow::Cow;

/// One persistent cache tensor (a [`Input::KvCache`] input).
#[derive(Clone, Debug)]
struct Cache {
    name: String,
    dtype: crate::graph::DType,
    shape: Shape,
    data: Vec<f32>,
}

/// The KV caches of an interpreter, matched to graph inputs by name, created on first use.
#[derive(Clone, Debug, Default)]
pub struct KvState {
    caches: Vec<Cache>,
}

impl KvState {
    /// Sets every cache cell to zero (the caches keep their sizes).
    pub fn clear(&mut self) {
        for c in &mut self.caches {
            c.data.iter_mut().for_each(|v| *v = 0.0);
        }
    }

    /// Sets cells `from..` of every cache to zero (cell `i` is row `i`, `{ne0}` values): what
    /// a fresh cache holds there.
    pub fn clear_cells(&mut self, from: usize) {
        for c in &mut self.caches {
            let row = c.shape.ne[0] as usize;
            let start = from.saturating_mul(row).min(c.data.len());
            c.data[start..].iter_mut().for_each(|v| *v = 0.0);
        }
    }

    /// Bytes the caches would take in their own dtypes.
    pub fn n_bytes(&self) -> u64 {
        self.caches
            .iter()
            .map(|c| c.shape.n_elements().unwrap_or(0) * c.dtype.type_size())
            .sum()
    }

    /// The values of cache `name` (one f32 per element; F16 caches hold f16 values), if it
    /// exists.
    pub fn get(&self, name: &str) -> Option<&[f32]> {
        self.caches
            .iter()
            .find(|c| c.name == name)
            .map(|c| c.data.as_slice())
    }

    fn bind(&mut self, t: &Tensor) -> Result<usize, InterpError> {
        if let Some(i) = self.caches.iter().position(|c| c.name == t.name) {
            let c = &self.caches[i];
            if c.dtype != t.dtype || c.shape != t.shape {
                return Err(InterpError::Input(format!(
                    "KV cache {} is {} {} but this graph wants {} {}",
                    t.name, c.shape, c.dtype, t.shape, t.dtype
                )));
            }
            return Ok(i);
        }
        let n = t
            .shape
            .n_elements()
            .ok_or_else(|| InterpError::Input(format!("KV cache {} is too large", t.name)))?;
        self.caches.push(Cache {
            name: t.name.clone(),
            dtype: t.dtype,
            shape: t.shape,
            data: vec![0f32; n as usize],
        });
        Ok(self.caches.len() - 1)
    }
}

/// The values of the graph's non-weight inputs for one run.
#[derive(Clone, Copy, Debug, Default)]
pub struct Inputs<'a> {
    /// Token ids ([`Input::Tokens`]).
    pub tokens: &'a [i32],
    /// Positions ([`Input::Positions`]).
    pub positions: &'a [i32],
    /// Output row ids ([`Input::OutputIds`]).
    pub output_ids: &'a [i32],
    /// The actual KV length (the value of every symbolic dimension); usually the last
    /// position of the ubatch + 1.
    pub kv_len: u64,
    /// [`Input::Data`] tensors by name, each its actual elements in `ne` order.
    pub data: &'a [(&'a str, &'a [f32])],
}

enum Val<'w> {
    Empty,
    F(Vec<f32>),
    I(Vec<i32>),
    W(&'w [u8], GgmlType),
    State(usize),
}

/// Executes graphs in f32 with the exact reference dequantization, optionally rounding as
/// llama.cpp's CPU backend does ([`InterpOptions`]). The KV caches persist across
/// [`Interpreter::run`] calls.
pub struct Interpreter<'w> {
    weights: &'w dyn WeightSource,
    opts: InterpOptions,
    state: KvState,
    /// Windows of KV caches by name, for graphs that store into a cache without the
    /// attention that reads it ([`Interpreter::set_cache_windows`]).
    cache_windows: std::collections::HashMap<String, u32>,
}

impl<'w> Interpreter<'w> {
    /// An interpreter reading weights from `weights`.
    pub fn new(weights: &'w dyn WeightSource, opts: InterpOptions) -> Interpreter<'w> {
        Interpreter {
            weights,
            opts,
            state: KvState::default(),
            cache_windows: Default::default(),
        }
    }

    /// The sliding window of the attention reading each named KV cache, for rings
    /// ([`InterpOptions::kv_ring_ubatch`]) in graphs that hold a cache's store but not the
    /// attention reading it (a plan's kernels run one by one: `crate::plan::exec`).
    pub fn set_cache_windows(&mut self, windows: impl IntoIterator<Item = (String, u32)>) {
        self.cache_windows = windows.into_iter().collect();
    }

    /// The options.
    pub fn options(&self) -> &InterpOptions {
        &self.opts
    }

    /// Cells of a cache of `rows` rows read with sliding window `window`: a ring of
    /// [`crate::plan::swa_cells`] cells with [`InterpOptions::kv_ring_ubatch`],
    /// else `rows`.
    fn ring_cells(&self, window: Option<u32>, rows: usize) -> usize {
        match (window, self.opts.kv_ring_ubatch) {
            (Some(w), Some(ub)) => crate::plan::swa_cells(rows as u64, w, ub) as usize,
            _ => rows,
        }
    }

    /// The KV caches.
    pub fn state(&self) -> &KvState {
        &self.state
    }

    /// The KV caches, mutably (to clear them).
    pub fn state_mut(&mut self) -> &mut KvState {
        &mut self.state
    }

    /// Runs `graph` and returns each output's actual elements in `ne` order.
    ///
    /// # Errors
    /// Graph verification errors; a missing weight or one whose type or shape differs from
    /// the graph's; input lengths that do not match the graph; out-of-range token ids or
    /// positions (naming the node).
    pub fn run(
        &mut self,
        graph: &Graph,
        inputs: &Inputs<'_>,
    ) -> Result<Vec<Vec<f32>>, InterpError> {
        self.run_inner(graph, inputs, None)
    }

    /// As [`Interpreter::run`], calling `trace(tensor, values)` after each node with the
    /// node's actual elements in `ne` order (llama.cpp's eval callback). KV stores and
    /// results that alias a weight are not traced.
    pub fn run_traced(
        &mut self,
        graph: &Graph,
        inputs: &Inputs<'_>,
        trace: &mut dyn FnMut(&Tensor, &[f32]),
    ) -> Result<Vec<Vec<f32>>, InterpError> {
        self.run_inner(graph, inputs, Some(trace))
    }

    fn run_inner(
        &mut self,
        graph: &Graph,
        inputs: &Inputs<'_>,
        mut trace: Option<&mut dyn FnMut(&Tensor, &[f32])>,
    ) -> Result<Vec<Vec<f32>>, InterpError> {
        graph.verify()?;
        let kv_len = inputs.kv_len;
        let lay = |id: TensorId| Lay::of(&graph.tensor(id).shape, kv_len);
        if graph.has_kv_dims() {
            for t in &graph.tensors {
                for d in 0..4 {
                    if t.shape.is_kv(d) && (kv_len == 0 || kv_len > t.shape.ne[d]) {
                        return Err(InterpError::Input(format!(
                            "KV length {kv_len} is outside 1..={} (tensor {})",
                            t.shape.ne[d], t.name
                        )));
                    }
                }
            }
        }
        // The window of each cache read by a sliding-window attention (for rings).
        let windows = if self.opts.kv_ring_ubatch.is_some() {
            let mut w = graph.cache_windows();
            for (i, t) in graph.tensors.iter().enumerate() {
                if let (Def::Input(Input::KvCache { .. }), Some(&win)) =
                    (&t.def, self.cache_windows.get(&t.name))
                {
                    w.entry(i).or_insert(win);
                }
            }
            w
        } else {
            Default::default()
        };
        // Last use of every tensor, to free intermediate values early.
        let mut last_use = vec![usize::MAX; graph.tensors.len()];
        for (i, n) in graph.nodes.iter().enumerate() {
            for s in &n.srcs {
                last_use[s.index()] = i;
            }
        }
        for o in &graph.outputs {
            last_use[o.index()] = usize::MAX;
        }
        let mut vals: Vec<Val<'w>> = Vec::with_capacity(graph.tensors.len());
        for t in &graph.tensors {
            vals.push(match &t.def {
                Def::Node(_) => Val::Empty,
                Def::Input(kind) => self.bind_input(t, kind, inputs)?,
            });
        }
        for (ni, node) in graph.nodes.iter().enumerate() {
            let out_t = graph.tensor(node.out);
            let err = |msg: String| InterpError::Node {
                node: out_t.name.clone(),
                op: node.op.name(),
                msg,
            };
            let lo = lay(node.out);
            let s = &node.srcs;
            let ctx = Ctx {
                graph,
                vals: &vals,
                state: &self.state,
                kv_len,
            };
            let result: Val<'w> = match &node.op {
                Op::GetRows => Val::F(self.get_rows(&ctx, s[0], s[1], &lo).map_err(err)?),
                Op::RmsNorm { eps } => {
                    let x = ctx.floats(s[0]).map_err(err)?;
                    Val::F(map_rows(&x, &lay(s[0]), |a, y| rms_norm_row(a, y, *eps)))
                }
                Op::Norm { eps } => {
                    let x = ctx.floats(s[0]).map_err(err)?;
                    Val::F(map_rows(&x, &lay(s[0]), |a, y| norm_row(a, y, *eps)))
                }
                Op::SoftMax { scale } if self.opts.avx2_order => {
                    // ggml_compute_forward_soft_max_f32 on x86: ggml_v_expf in groups of 8.
                    let x = ctx.floats(s[0]).map_err(err)?;
                    Val::F(map_rows(&x, &lay(s[0]), |a, y| {
                        super::elementwise::soft_max_row_x86(a, y, *scale)
                    }))
                }
                Op::SoftMax { scale } => {
                    let x = ctx.floats(s[0]).map_err(err)?;
                    Val::F(map_rows(&x, &lay(s[0]), |a, y| soft_max_row(a, y, *scale)))
                }
                Op::Add | Op::Mul => {
                    let a = ctx.floats(s[0]).map_err(err)?;
                    let b = ctx.floats(s[1]).map_err(err)?;
                    let (la, lb) = (lay(s[0]), lay(s[1]));
                    Val::F(if node.op == Op::Add {
                        binary(&a, &la, &b, &lb, |x, y| x + y)
                    } else {
                        binary(&a, &la, &b, &lb, |x, y| x * y)
                    })
                }
                Op::TopK { k } => {
                    let x = ctx.floats(s[0]).map_err(err)?;
                    Val::I(super::moe::top_k(&x, &lay(s[0]), *k as usize, &lo))
                }
                Op::MoeWeights { norm, scale } => {
                    let p = ctx.floats(s[0]).map_err(err)?;
                    let ids = ctx.ints(s[1]).map_err(err)?;
                    Val::F(
                        super::moe::moe_weights(
                            &p,
                            &lay(s[0]),
                            ids,
                            &lay(s[1]),
                            *norm,
                            *scale,
                            &lo,
                        )
                        .map_err(err)?,
                    )
                }
                Op::MulMatId => {
                    let b = ctx.floats(s[1]).map_err(err)?;
                    let ids = ctx.ints(s[2]).map_err(err)?;
                    let at = graph.tensor(s[0]);
                    let fl;
                    let ex = match &vals[s[0].index()] {
                        Val::W(data, ty) => super::moe::Experts::Weight {
                            ty: *ty,
                            data,
                            ne: at.shape.ne.map(|n| n as usize),
                        },
                        _ => {
                            fl = ctx.floats(s[0]).map_err(err)?;
                            super::moe::Experts::Float {
                                data: &fl,
                                lay: lay(s[0]),
                            }
                        }
                    };
                    Val::F(
                        super::moe::mul_mat_id(
                            &ex,
                            &b,
                            &lay(s[1]),
                            ids,
                            &lay(s[2]),
                            &lo,
                            self.mat_opts(),
                        )
                        .map_err(err)?,
                    )
                }
                Op::MoeSum => {
                    let x = ctx.floats(s[0]).map_err(err)?;
                    let w = ctx.floats(s[1]).map_err(err)?;
                    Val::F(super::moe::moe_sum(&x, &lay(s[0]), &w, &lay(s[1]), &lo))
                }
                Op::Hadamard { n } => {
                    let n = *n as usize;
                    Val::F(map_rows(
                        &ctx.floats(s[0]).map_err(err)?,
                        &lay(s[0]),
                        |a, y| {
                            y.copy_from_slice(a);
                            y.chunks_exact_mut(n).for_each(ggml::fwht);
                        },
                    ))
                }
                Op::Scale { s: k } => {
                    let k = *k;
                    Val::F(unary(&ctx.floats(s[0]).map_err(err)?, &lay(s[0]), |x| {
                        x * k
                    }))
                }
                Op::Silu if self.opts.avx2_order => Val::F(map_rows(
                    &ctx.floats(s[0]).map_err(err)?,
                    &lay(s[0]),
                    |a, y| avx2::silu_row(a, None, y),
                )),
                Op::Silu => Val::F(unary(&ctx.floats(s[0]).map_err(err)?, &lay(s[0]), silu)),
                Op::Gelu => {
                    let f = if self.opts.gelu_f16 {
                        gelu_f16_table
                    } else {
                        gelu
                    };
                    Val::F(unary(&ctx.floats(s[0]).map_err(err)?, &lay(s[0]), f))
                }
                Op::Tanh => Val::F(unary(
                    &ctx.floats(s[0]).map_err(err)?,
                    &lay(s[0]),
                    f32::tanh,
                )),
                Op::SoftCap { cap } => {
                    let c = *cap;
                    Val::F(unary(&ctx.floats(s[0]).map_err(err)?, &lay(s[0]), |x| {
                        (x * (1.0 / c)).tanh() * c
                    }))
                }
                Op::Swiglu if self.opts.avx2_order => {
                    let g = ctx.floats(s[0]).map_err(err)?;
                    let u = ctx.floats(s[1]).map_err(err)?;
                    let l = lay(s[0]);
                    let mut out = vec![0f32; l.alloc];
                    for r in 0..l.n_rows() {
                        let o = l.row_off(r);
                        let n0 = l.ne[0];
                        avx2::silu_row(&g[o..o + n0], Some(&u[o..o + n0]), &mut out[o..o + n0]);
                    }
                    Val::F(out)
                }
                Op::Swiglu | Op::Geglu => {
                    let g = ctx.floats(s[0]).map_err(err)?;
                    let u = ctx.floats(s[1]).map_err(err)?;
                    let f: fn(f32) -> f32 = match (&node.op, self.opts.gelu_f16) {
                        (Op::Swiglu, _) => silu,
                        (_, true) => gelu_f16_table,
                        (_, false) => gelu,
                    };
                    Val::F(glu(&g, &u, &lay(s[0]), f))
                }
                Op::MulMat => Val::F(self.mul_mat(&ctx, s[0], s[1], &lo).map_err(err)?),
                Op::Rope(p) => {
                    let x = ctx.floats(s[0]).map_err(err)?;
                    let pos = ctx.ints(s[1]).map_err(err)?;
                    let ff = match s.get(2) {
                        Some(f) => Some(ctx.floats(*f).map_err(err)?),
                        None => None,
                    };
                    Val::F(rope(
                        &x,
                        &lay(s[0]),
                        pos,
                        ff.as_deref(),
                        p,
                        self.opts.avx2_order,
                    ))
                }
                Op::KvStore => {
                    let Val::State(si) = vals[s[0].index()] else {
                        return Err(err(
                            "the cache source is not a KV cache input or store".into()
                        ));
                    };
                    let cur = ctx.floats(s[1]).map_err(err)?.into_owned();
                    let pos = ctx.ints(s[2]).map_err(err)?.to_vec();
                    let (lc, lcur) = (lay(s[0]), lay(s[1]));
                    let cells = self.ring_cells(windows.get(&s[0].index()).copied(), lc.ne[1]);
                    let cache = &mut self.state.caches[si];
                    kv_store(
                        &mut cache.data,
                        &lc,
                        cache.dtype,
                        self.opts.q8_flavor,
                        &cur,
                        &lcur,
                        &pos,
                        cells,
                    )
                    .map_err(err)?;
                    Val::State(si)
                }
                Op::Attention(p) => {
                    let mode = match (self.opts.flash_attn, self.opts.attn_f16) {
                        (true, _) => AttnMode::Flash,
                        (false, true) => AttnMode::F16,
                        (false, false) => AttnMode::Exact,
                    };
                    let q = ctx.floats(s[0]).map_err(err)?;
                    // llama.cpp casts an F32 K or V to F16 before its flash kernel.
                    let cast = |id: TensorId| -> Result<(Cow<'_, [f32]>, DType), InterpError> {
                        let (x, t) = (ctx.floats(id).map_err(err)?, graph.tensor(id).dtype);
                        Ok(if mode == AttnMode::Flash && t == DType::F32 {
                            (x.iter().map(|&v| round_f16(v)).collect(), DType::F16)
                        } else {
                            (x, t)
                        })
                    };
                    let (k, k_type) = cast(s[1])?;
                    let (v, v_type) = cast(s[2])?;
                    let pos = ctx.ints(s[3]).map_err(err)?;
                    let args = AttnArgs {
                        q: &q,
                        lq: lay(s[0]),
                        k: &k,
                        lk: lay(s[1]),
                        v: &v,
                        lv: lay(s[2]),
                        k_type,
                        v_type,
                        pos,
                        out: lo,
                    };
                    let cfg = AttnCfg {
                        mode,
                        avx2: self.opts.avx2_order,
                        n_ctx: self.ring_cells(
                            p.window.filter(|_| p.causal),
                            graph.tensor(s[1]).shape.ne[2] as usize,
                        ),
                        llama_threads: self.opts.llama_threads,
                        n_threads: self.opts.n_threads,
                        flavor: self.opts.q8_flavor,
                    };
                    if mode == AttnMode::F16
                        && !matches!(
                            args.v_type,
                            crate::graph::DType::F16 | crate::graph::DType::F32
                        )
                    {
                        return Err(err(format!(
                            "a {} V cache needs flash attention (as in llama.cpp)",
                            args.v_type
                        )));
                    }
                    Val::F(attention(&args, p, &cfg))
                }
                Op::Reshape { .. } => match &vals[s[0].index()] {
                    Val::W(d, t) => Val::W(d, *t),
                    _ => Val::F(ctx.floats(s[0]).map_err(err)?.into_owned()),
                },
                Op::View { nb, offset, .. } => {
                    let src = ctx.floats(s[0]).map_err(err)?;
                    let dt = graph.tensor(s[0]).dtype;
                    let (ts, bs) = (dt.type_size(), dt.block_size());
                    if bs == 1 {
                        Val::F(view(&src, &lo, nb, *offset, ts).map_err(err)?)
                    } else {
                        // The values of a block-typed tensor (a Q8_0 cache) are held one f32
                        // each: strides of whole blocks become strides of f32 values.
                        if nb[1..].iter().any(|b| b % ts != 0) || offset % ts != 0 {
                            return Err(err(format!(
                                "a view of {dt} with strides {nb:?} splits blocks"
                            )));
                        }
                        let f = |b: u64| b / ts * bs * 4;
                        let nb_f = [4, f(nb[1]), f(nb[2]), f(nb[3])];
                        Val::F(view(&src, &lo, &nb_f, f(*offset), 4).map_err(err)?)
                    }
                }
                Op::Permute { axes } => Val::F(permute(
                    &ctx.floats(s[0]).map_err(err)?,
                    &lay(s[0]),
                    &lo,
                    axes,
                )),
                Op::Cont => Val::F(copy_to(&ctx.floats(s[0]).map_err(err)?, &lay(s[0]), &lo)),
            };
            vals[node.out.index()] = result;
            if let (Some(tr), Val::F(v)) = (trace.as_mut(), &vals[node.out.index()]) {
                tr(out_t, &dense(v, &lo));
            }
            for src in &node.srcs {
                if last_use[src.index()] == ni && matches!(graph.tensor(*src).def, Def::Node(_)) {
                    vals[src.index()] = Val::Empty;
                }
            }
        }
        let ctx = Ctx {
            graph,
            vals: &vals,
            state: &self.state,
            kv_len,
        };
        graph
            .outputs
            .iter()
            .map(|o| {
                // An I32 output (a selection of experts) comes back as its bits.
                if let Val::I(v) = &vals[o.index()] {
                    let f: Vec<f32> = v.iter().map(|&i| f32::from_bits(i as u32)).collect();
                    return Ok(dense(&f, &lay(*o)));
                }
                let v = ctx.floats(*o).map_err(InterpError::Input)?;
                Ok(dense(&v, &lay(*o)))
            })
            .collect()
    }

    fn bind_input(
        &mut self,
        t: &Tensor,
        kind: &Input,
        inputs: &Inputs<'_>,
    ) -> Result<Val<'w>, InterpError> {
        let want = t.shape.ne[0] as usize;
        let ints = |what: &str, v: &[i32]| -> Result<Val<'w>, InterpError> {
            if v.len() != want {
                return Err(InterpError::Input(format!(
                    "{what}: the graph takes {want} values, got {}",
                    v.len()
                )));
            }
            Ok(Val::I(v.to_vec()))
        };
        match kind {
            Input::Tokens => ints("tokens", inputs.tokens),
            Input::Positions => ints("positions", inputs.positions),
            Input::OutputIds => ints("output ids", inputs.output_ids),
            Input::KvCache { .. } => Ok(Val::State(self.state.bind(t)?)),
            Input::Data => {
                let (_, v) = inputs
                    .data
                    .iter()
                    .find(|(n, _)| *n == t.name)
                    .ok_or_else(|| {
                        InterpError::Input(format!("no data given for input {}", t.name))
                    })?;
                let n = t.shape.n_elements().unwrap_or(0) as usize;
                if t.dtype == crate::graph::DType::I32 && v.len() == n {
                    // I32 data (a computed selection of experts) is given as its bits.
                    return Ok(Val::I(v.iter().map(|x| x.to_bits() as i32).collect()));
                }
                if v.len() != n || t.dtype == crate::graph::DType::I32 {
                    return Err(InterpError::Input(format!(
                        "input {} is {} {}: expected {n} f32 values, got {}",
                        t.name,
                        t.shape,
                        t.dtype,
                        v.len()
                    )));
                }
                Ok(Val::F(v.to_vec()))
            }
            Input::Weight => {
                let w = self
                    .weights
                    .weight(&t.name)
                    .ok_or_else(|| InterpError::MissingWeight(t.name.clone()))?;
                if w.ggml_type != t.dtype.ggml_type() || w.ne != t.shape.ne {
                    return Err(InterpError::WeightMismatch {
                        name: t.name.clone(),
                        graph: format!("{} {}", t.shape, t.dtype),
                        found: format!("{} {}", Shape { ne: w.ne, kv: 0 }, w.ggml_type),
                    });
                }
                let need = t
                    .dtype
                    .row_size(t.shape.ne[0])
                    .and_then(|r| r.checked_mul(t.shape.ne[1] * t.shape.ne[2] * t.shape.ne[3]));
                if need != Some(w.data.len() as u64) {
                    return Err(InterpError::WeightMismatch {
                        name: t.name.clone(),
                        graph: format!("{need:?} bytes"),
                        found: format!("{} bytes", w.data.len()),
                    });
                }
                Ok(Val::W(w.data, w.ggml_type))
            }
        }
    }

    fn mat_opts(&self) -> MatOpts {
        MatOpts {
            round: self.opts.matmul_rounding,
            flavor: self.opts.q8_flavor,
            n_threads: self.opts.n_threads.max(1),
            order: if self.opts.avx2_order {
                Order::Avx2
            } else {
                Order::Reference
            },
        }
    }

    fn mul_mat(
        &self,
        ctx: &Ctx<'_, 'w>,
        a: TensorId,
        b: TensorId,
        lo: &Lay,
    ) -> Result<Vec<f32>, String> {
        let bv = ctx.floats(b)?;
        let lb = ctx.lay(b);
        let at = ctx.graph.tensor(a);
        let am = match &ctx.vals[a.index()] {
            Val::W(data, ty) => MatA::Weight {
                ty: *ty,
                data,
                ne: at.shape.ne.map(|n| n as usize),
            },
            _ => {
                let data = ctx.floats(a)?;
                return mul_mat(
                    &MatA::Float {
                        dtype: at.dtype,
                        data: &data,
                        lay: ctx.lay(a),
                    },
                    &bv,
                    &lb,
                    lo,
                    self.mat_opts(),
                );
            }
        };
        mul_mat(&am, &bv, &lb, lo, self.mat_opts())
    }

    fn get_rows(
        &self,
        ctx: &Ctx<'_, 'w>,
        table: TensorId,
        ids: TensorId,
        lo: &Lay,
    ) -> Result<Vec<f32>, String> {
        let ids = ctx.ints(ids)?;
        let tt = ctx.graph.tensor(table);
        let (k, n_rows) = (tt.shape.ne[0] as usize, tt.shape.ne[1] as usize);
        let mut out = vec![0f32; lo.alloc];
        let table_f = match &ctx.vals[table.index()] {
            Val::W(..) => None,
            _ => Some(ctx.floats(table)?),
        };
        let lt = ctx.lay(table);
        for (n, &id) in ids.iter().enumerate() {
            if id < 0 || id as usize >= n_rows {
                return Err(format!(
                    "row id {id} is outside table {} of {n_rows} rows",
                    tt.name
                ));
            }
            let dst = &mut out[lo.off([0, n, 0, 0])..][..k];
            match (&table_f, &ctx.vals[table.index()]) {
                (Some(f), _) => {
                    let o = lt.off([0, id as usize, 0, 0]);
                    dst.copy_from_slice(&f[o..o + k]);
                }
                (None, Val::W(data, ty)) => {
                    let rb = ty.row_size(k as u64).unwrap_or(0) as usize;
                    let row = data
                        .get(id as usize * rb..(id as usize + 1) * rb)
                        .ok_or("table row out of range")?;
                    ggml::dequantize(*ty, row, dst).map_err(|e| e.to_string())?;
                }
                _ => return Err("table has no values".into()),
            }
        }
        Ok(out)
    }
}

/// Read access to the values during a run.
struct Ctx<'a, 'w> {
    graph: &'a Graph,
    vals: &'a [Val<'w>],
    state: &'a KvState,
    kv_len: u64,
}

impl<'a, 'w> Ctx<'a, 'w> {
    fn lay(&self, id: TensorId) -> Lay {
        Lay::of(&self.graph.tensor(id).shape, self.kv_len)
    }

    /// The stored float values of `id` (weights are dequantized whole).
    fn floats(&self, id: TensorId) -> Result<Cow<'a, [f32]>, String> {
        let t = self.graph.tensor(id);
        match &self.vals[id.index()] {
            Val::F(v) => Ok(Cow::Borrowed(v.as_slice())),
            Val::State(i) => Ok(Cow::Borrowed(self.state.caches[*i].data.as_slice())),
            Val::W(data, ty) => {
                let n = t.shape.n_elements().unwrap_or(0) as usize;
                let mut v = vec![0f32; n];
                ggml::dequantize(*ty, data, &mut v).map_err(|e| format!("{}: {e}", t.name))?;
                Ok(Cow::Owned(v))
            }
            Val::I(_) => Err(format!("{} is I32 where floats are needed", t.name)),
            Val::Empty => Err(format!("{} has no value (freed or never computed)", t.name)),
        }
    }

    fn ints(&self, id: TensorId) -> Result<&'a [i32], String> {
        match &self.vals[id.index()] {
            Val::I(v) => Ok(v.as_slice()),
            _ => Err(format!(
                "{} is not an I32 input",
                self.graph.tensor(id).name
            )),
        }
    }
}

/// The actual elements of a stored tensor, in `ne` order.
fn dense(v: &[f32], lay: &Lay) -> Vec<f32> {
    if lay.is_dense() {
        let n: usize = lay.ne.iter().product();
        return v[..n].to_vec();
    }
    let mut out = Vec::with_capacity(lay.ne.iter().product());
    super::layout::for_each_index(lay, |_, o| out.push(v[o]));
    out
}
