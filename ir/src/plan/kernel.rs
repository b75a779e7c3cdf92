//! The kernel ops of a plan: single IR ops and the fused ops the passes form, each defined by
//! its *expansion*, the sequence of IR ops it computes ([`KernelOp::expand`]).
//!
//! The expansion is the reference semantics of a fused kernel: [`super::exec`] runs it op by
//! op with the interpreter's implementations, the verifier types it with the graph's shape
//! rules, and a backend's generated kernel must compute what it computes (in the same order
//! where results are to be bit-identical).

use crate::graph::{infer, DType, Op, RopeParams, SrcType};
use serde::{Deserialize, Serialize};

/// What a matrix-product kernel does after the products.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Epilogue {
    /// The products are the results.
    None,
    /// One product plus one more source: `y = W·x + r` (the residual add, or a bias,
    /// broadcast as `ggml_add` does). Needs `n_mat == 1`.
    Add,
    /// Two products, gate and up: `y = silu(W_gate·x) * (W_up·x)` (`ggml_swiglu_split`).
    /// Needs `n_mat == 2`.
    Swiglu,
    /// As [`Epilogue::Swiglu`] with GELU (tanh form): `ggml_geglu_split`.
    Geglu,
}

/// A (possibly fused) matrix product: `n_mat` weights applied to one input, optionally
/// rms-normalized and scaled by a weight vector first, with an [`Epilogue`].
///
/// Sources: `x {K, N}` (F32), then `norm_w {K}` if `norm` is set, then the weights
/// `W_i {K, M_i}` (any dtype), then `r` if the epilogue is [`Epilogue::Add`].
/// Results: `y_i {M_i, N}` for each weight, or one `{M, N}` for the GLU epilogues.
///
/// Expansion: `x' = mul(rms_norm(x, eps), norm_w)` (or `x' = x`); `t_i = mul_mat(W_i, x')`;
/// then the epilogue (`add(t_0, r)`, `swiglu(t_0, t_1)`, `geglu(t_0, t_1)`).
/// This covers `attn_norm` × q/k/v (`norm`, `n_mat = 3`), the output projection with the
/// residual add (`Add`), `ffn_norm` × gate/up with the activation (`norm`, `n_mat = 2`,
/// `Swiglu`), the down projection with the residual add, and the final norm × output.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct MulMatSpec {
    /// `Some(eps)`: the input is `rms_norm(x, eps) * norm_w` (llama.cpp's `build_norm` with
    /// `LLM_NORM_RMS`).
    pub norm: Option<f32>,
    /// Number of weights sharing the input (q/k/v: 3; gate/up: 2).
    pub n_mat: u8,
    /// What follows the products.
    pub epilogue: Epilogue,
}

/// Rope of K written straight into the K cache, optionally with the rope of Q (same
/// positions and parameters) and the store of V (same positions).
///
/// Sources: `k {d_k, n_head_kv, N}`, `pos I32 {N}`, then `freq_factors {n_rot / 2}` if
/// `freq_factors`, then `q {d_k, n_head, N}` if `q`, then `v {n_embd_v_gqa, N}` if `v`.
/// Results: the K cache `{n_embd_k_gqa, n_ctx}`, then `q_roped` (shape of `q`) if `q`, then
/// the V cache if `v`. The caches are updated in place: only rows `pos[i]` change.
///
/// Expansion: `k_cache = kv_store(k_cache, reshape(rope(k, pos), {n_embd_k_gqa, N}), pos)`,
/// `q_roped = rope(q, pos)`, `v_cache = kv_store(v_cache, v, pos)`.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct RopeKvStoreSpec {
    /// The rope parameters (of both K and Q).
    pub rope: RopeParams,
    /// Whether the rope takes frequency factors.
    pub freq_factors: bool,
    /// Whether the rope of Q is part of the kernel.
    pub q: bool,
    /// Whether the store of V is part of the kernel.
    pub v: bool,
}

/// What a kernel computes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum KernelOp {
    /// One IR op as the graph has it: sources as the op's ([`Op`] documents them), one
    /// result. [`Op::KvStore`]'s result is its cache (source 0) updated in place.
    /// Attention over the KV cache is this with [`Op::Attention`]: one kernel already.
    Op(Op),
    /// `rms_norm(x, eps) * w`: sources `x {K, N}`, `w {K}`; result `{K, N}`. The final
    /// norm when its consumer cannot take it as a prologue.
    RmsNormMul {
        /// Added to the mean square.
        eps: f32,
    },
    /// A matrix product with its prologue and epilogue ([`MulMatSpec`]).
    MulMat(MulMatSpec),
    /// Rope into the KV store ([`RopeKvStoreSpec`]).
    RopeKvStore(RopeKvStoreSpec),
}

/// An operand of one op of an expansion.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Slot {
    /// Source `i` of the kernel.
    Src(usize),
    /// Result `i` of the kernel (read only by in-place ops: the KV store reads its cache).
    Dst(usize),
    /// Temporary `i` of the expansion.
    Tmp(usize),
}

/// One op of an expansion: `out = op(srcs)`.
#[derive(Clone, Debug, PartialEq)]
pub struct MicroOp {
    /// The IR op.
    pub op: Op,
    /// Its sources.
    pub srcs: Vec<Slot>,
    /// Where the result goes (a temporary or a kernel result).
    pub out: Slot,
}

/// A kernel op written out as IR ops, with the type of each temporary.
#[derive(Clone, Debug)]
pub struct Expansion {
    /// The ops, in execution order.
    pub ops: Vec<MicroOp>,
    /// Type of temporary `i`.
    pub tmps: Vec<SrcType>,
}

impl KernelOp {
    /// A short name for printing: the op's ggml name, or the fused ops joined with `+`
    /// (`rms_norm+mul+mul_mat×3`, `mul_mat+add`, `rope+kv_store`). Distinct ops have
    /// distinct names (a [`MulMatSpec`] of one weight and nothing else is `mul_mat×1`), so
    /// the plan's text form can name every op ([`super::parse_plan`] reads them back).
    pub fn name(&self) -> String {
        match self {
            KernelOp::Op(op) => op.name().to_string(),
            KernelOp::RmsNormMul { .. } => "rms_norm+mul".to_string(),
            KernelOp::MulMat(m) => {
                let mut s = String::new();
                if m.norm.is_some() {
                    s += "rms_norm+mul+";
                }
                s += "mul_mat";
                // A bare one-weight spec is `mul_mat×1`, told apart from the plain op.
                if m.n_mat != 1 || (m.norm.is_none() && m.epilogue == Epilogue::None) {
                    s += &format!("×{}", m.n_mat);
                }
                s += match m.epilogue {
                    Epilogue::None => "",
                    Epilogue::Add => "+add",
                    Epilogue::Swiglu => "+swiglu",
                    Epilogue::Geglu => "+geglu",
                };
                s
            }
            KernelOp::RopeKvStore(r) => {
                let mut s = "rope+kv_store".to_string();
                if r.q {
                    s += "+rope_q";
                }
                if r.v {
                    s += "+kv_store_v";
                }
                s
            }
        }
    }

    /// Whether this is a fused op (more than one IR op).
    pub fn is_fused(&self) -> bool {
        !matches!(self, KernelOp::Op(_))
    }

    /// Numbers of sources and results the op takes: `((min, max) sources, results)`.
    pub fn arity(&self) -> ((usize, usize), usize) {
        match self {
            KernelOp::Op(op) => (op.arity(), 1),
            KernelOp::RmsNormMul { .. } => ((2, 2), 1),
            KernelOp::MulMat(m) => {
                let n = 1
                    + m.norm.is_some() as usize
                    + m.n_mat as usize
                    + (m.epilogue == Epilogue::Add) as usize;
                let d = match m.epilogue {
                    Epilogue::Swiglu | Epilogue::Geglu => 1,
                    _ => m.n_mat as usize,
                };
                ((n, n), d)
            }
            KernelOp::RopeKvStore(r) => {
                let n = 2 + r.freq_factors as usize + r.q as usize + r.v as usize;
                ((n, n), 1 + r.q as usize + r.v as usize)
            }
        }
    }

    /// The source whose bytes result `dst` must be (the op updates it in place): the cache
    /// of [`Op::KvStore`].
    pub fn in_place_src(&self, dst: usize) -> Option<usize> {
        match self {
            KernelOp::Op(op) if dst == 0 => op.in_place_src(),
            _ => None,
        }
    }

    /// Whether the kernel is defined when result `dst` occupies exactly the bytes of source
    /// `src` (same view): each element of the result is written only after the last read of
    /// the source element at the same place. The memory planner reuses buffers in place only
    /// where this holds; every backend's kernel must honour it.
    ///
    /// Elementwise and row-wise ops (norms, softmax, rope, activations, add, mul, GLUs) may
    /// overwrite their first source (and add / mul / GLUs their second); a matrix product may
    /// overwrite its residual; the rope of Q may overwrite Q. A matrix product never
    /// overwrites its input (every result row reads all of it).
    pub fn may_alias(&self, src: usize, dst: usize) -> bool {
        if self.in_place_src(dst) == Some(src) {
            return true;
        }
        match self {
            KernelOp::Op(op) => {
                dst == 0
                    && match op {
                        Op::RmsNorm { .. }
                        | Op::Norm { .. }
                        | Op::Scale { .. }
                        | Op::SoftMax { .. }
                        | Op::Silu
                        | Op::Gelu
                        | Op::Tanh
                        | Op::SoftCap { .. }
                        | Op::Rope(_) => src == 0,
                        Op::Add | Op::Mul | Op::Swiglu | Op::Geglu => src <= 1,
                        _ => false,
                    }
            }
            KernelOp::RmsNormMul { .. } => src == 0 && dst == 0,
            KernelOp::MulMat(m) => {
                m.epilogue == Epilogue::Add && dst == 0 && src + 1 == self.arity().0 .0
            }
            KernelOp::RopeKvStore(r) => r.q && dst == 1 && src == 2 + r.freq_factors as usize,
        }
    }

    /// The op as IR ops over the kernel's sources and results, typed by the graph's shape
    /// rules; checks that every result has the type the expansion gives it.
    ///
    /// # Errors
    /// A message naming the op, the operand and both types when the operands do not fit.
    pub fn expand(&self, srcs: &[SrcType], dsts: &[SrcType]) -> Result<Expansion, String> {
        let ((lo, hi), nd) = self.arity();
        if srcs.len() < lo || srcs.len() > hi || dsts.len() != nd {
            return Err(format!(
                "{} takes {lo}..={hi} sources and {nd} results, got {} and {}",
                self.name(),
                srcs.len(),
                dsts.len()
            ));
        }
        let mut e = Expander {
            srcs,
            dsts,
            ops: Vec::new(),
            tmps: Vec::new(),
        };
        match self {
            KernelOp::Op(op) => {
                let s = (0..srcs.len()).map(Slot::Src).collect();
                e.push(op.clone(), s, Some(Slot::Dst(0)))?;
            }
            KernelOp::RmsNormMul { eps } => {
                let t = e.push(Op::RmsNorm { eps: *eps }, vec![Slot::Src(0)], None)?;
                e.push(Op::Mul, vec![t, Slot::Src(1)], Some(Slot::Dst(0)))?;
            }
            KernelOp::MulMat(m) => expand_mul_mat(&mut e, m)?,
            KernelOp::RopeKvStore(r) => expand_rope_kv_store(&mut e, r)?,
        }
        Ok(Expansion {
            ops: e.ops,
            tmps: e.tmps,
        })
    }
}

fn expand_mul_mat(e: &mut Expander, m: &MulMatSpec) -> Result<(), String> {
    if m.n_mat == 0
        || (m.epilogue == Epilogue::Add && m.n_mat != 1)
        || (matches!(m.epilogue, Epilogue::Swiglu | Epilogue::Geglu) && m.n_mat != 2)
    {
        return Err(format!(
            "mul_mat with {} weights cannot have epilogue {:?}",
            m.n_mat, m.epilogue
        ));
    }
    let mut x = Slot::Src(0);
    let mut next = 1;
    if let Some(eps) = m.norm {
        let t = e.push(Op::RmsNorm { eps }, vec![x], None)?;
        x = e.push(Op::Mul, vec![t, Slot::Src(1)], None)?;
        next = 2;
    }
    let direct = m.epilogue == Epilogue::None;
    let mut prods = Vec::new();
    for i in 0..m.n_mat as usize {
        let out = direct.then_some(Slot::Dst(i));
        prods.push(e.push(Op::MulMat, vec![Slot::Src(next + i), x], out)?);
    }
    let r = next + m.n_mat as usize;
    match m.epilogue {
        Epilogue::None => {}
        Epilogue::Add => {
            e.push(Op::Add, vec![prods[0], Slot::Src(r)], Some(Slot::Dst(0)))?;
        }
        Epilogue::Swiglu => {
            e.push(Op::Swiglu, vec![prods[0], prods[1]], Some(Slot::Dst(0)))?;
        }
        Epilogue::Geglu => {
            e.push(Op::Geglu, vec![prods[0], prods[1]], Some(Slot::Dst(0)))?;
        }
    }
    Ok(())
}

fn expand_rope_kv_store(e: &mut Expander, r: &RopeKvStoreSpec) -> Result<(), String> {
    let pos = Slot::Src(1);
    let rope_srcs = |x: Slot| {
        let mut s = vec![x, pos];
        if r.freq_factors {
            s.push(Slot::Src(2));
        }
        s
    };
    let mut next = 2 + r.freq_factors as usize;
    let k_roped = e.push(Op::Rope(r.rope), rope_srcs(Slot::Src(0)), None)?;
    let k = e.srcs[0].shape.ne;
    let flat = e.push(
        Op::Reshape {
            ne: [k[0] * k[1], k[2], 1, 1],
        },
        vec![k_roped],
        None,
    )?;
    e.push(
        Op::KvStore,
        vec![Slot::Dst(0), flat, pos],
        Some(Slot::Dst(0)),
    )?;
    let mut dst = 1;
    if r.q {
        e.push(
            Op::Rope(r.rope),
            rope_srcs(Slot::Src(next)),
            Some(Slot::Dst(dst)),
        )?;
        next += 1;
        dst += 1;
    }
    if r.v {
        e.push(
            Op::KvStore,
            vec![Slot::Dst(dst), Slot::Src(next), pos],
            Some(Slot::Dst(dst)),
        )?;
    }
    Ok(())
}

/// Builds an expansion, typing each op as it is added.
struct Expander<'a> {
    srcs: &'a [SrcType],
    dsts: &'a [SrcType],
    ops: Vec<MicroOp>,
    tmps: Vec<SrcType>,
}

impl Expander<'_> {
    fn ty(&self, s: Slot) -> SrcType {
        match s {
            Slot::Src(i) => self.srcs[i],
            Slot::Dst(i) => self.dsts[i],
            Slot::Tmp(i) => self.tmps[i],
        }
    }

    /// Adds `op(srcs)`, writing to `out` (a new temporary when `None`); checks the type.
    fn push(&mut self, op: Op, srcs: Vec<Slot>, out: Option<Slot>) -> Result<Slot, String> {
        let types: Vec<SrcType> = srcs.iter().map(|&s| self.ty(s)).collect();
        let (dtype, shape) = infer(&op, &types).map_err(|m| format!("{}: {m}", op.name()))?;
        let slot = match out {
            Some(s) => {
                let want = self.ty(s);
                if want.dtype != dtype || want.shape != shape {
                    return Err(format!(
                        "{} gives {shape} {dtype} but result {s:?} is {} {}",
                        op.name(),
                        want.shape,
                        want.dtype
                    ));
                }
                s
            }
            None => {
                let contiguous = !op.is_view() || types[0].contiguous;
                self.tmps.push(SrcType {
                    dtype,
                    shape,
                    contiguous,
                });
                Slot::Tmp(self.tmps.len() - 1)
            }
        };
        self.ops.push(MicroOp {
            op,
            srcs,
            out: slot,
        });
        Ok(slot)
    }
}

/// Whether `dtype` is a type an arena value can have (activations, token ids, positions).
pub(crate) fn is_arena_dtype(dtype: DType) -> bool {
    matches!(dtype, DType::F32 | DType::F16 | DType::BF16 | DType::I32)
}
