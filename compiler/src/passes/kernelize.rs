//! Pass `kernelize`: the specialized graphs become a plan with one kernel per computing
//! node.
//!
//! - Weights become the plan's weight table (by GGUF name, each once across all steps) and
//!   KV cache inputs its KV table (by name; every step must agree on their types).
//! - Token ids, positions, output rows and data inputs become arena buffers the caller fills.
//! - Views (reshape, view, permute) compute nothing: their result is a [`Value`] over the
//!   bytes of their source with the new shape, strides and offset (ggml's `view` strides are
//!   byte strides of the underlying storage, so they carry over unchanged).
//! - `kv_store` writes its cache in place: its result is the cache's value again.
//! - Every other node becomes a kernel [`KernelOp::Op`] writing a fresh arena buffer of its
//!   result's size at the bound of the KV length.
//!
//! No offsets yet: `plan-memory` assigns them.

use super::{CompileOptions, PassError, StepShape};
use ir::graph::{contiguous_nb, Def, Graph, Input, Op, MAX_DIMS};
use ir::plan::{
    dense_bytes, Base, Buffer, BufferId, Kernel, KernelOp, KvBuf, KvId, Plan, Step, StepInput,
    TailPolicy, Value, ValueId, WeightBuf, WeightId, PLAN_FORMAT,
};

/// The plan of `graphs` (one step each), unfused and unplanned.
///
/// # Errors
/// [`PassError::Graph`] for a graph whose weights or KV caches disagree with another's, a
/// result too large to address, a reshape of a non-contiguous value, or an output that is
/// not computed in the arena.
pub fn kernelize(graphs: &[(StepShape, Graph)], opts: &CompileOptions) -> Result<Plan, PassError> {
    let mut plan = Plan {
        format: PLAN_FORMAT,
        n_ctx: opts.n_ctx,
        align: opts.align,
        tail: TailPolicy::Pad,
        weights: Vec::new(),
        kv: Vec::new(),
        steps: Vec::new(),
        target: None,
    };
    let mut sorted: Vec<&(StepShape, Graph)> = graphs.iter().collect();
    sorted.sort_by_key(|(s, _)| *s);
    for (shape, g) in sorted {
        let step = step_of(&mut plan, *shape, g).map_err(|msg| PassError::Graph {
            n_tokens: shape.n_tokens,
            msg,
        })?;
        plan.steps.push(step);
    }
    Ok(plan)
}

fn step_of(plan: &mut Plan, shape: StepShape, g: &Graph) -> Result<Step, String> {
    let mut s = Step {
        n_tokens: shape.n_tokens,
        n_outputs: shape.n_outputs,
        buffers: Vec::new(),
        values: Vec::new(),
        kernels: Vec::new(),
        inputs: Vec::new(),
        outputs: Vec::new(),
        arena_bytes: 0,
    };
    let mut val: Vec<Option<ValueId>> = vec![None; g.tensors.len()];
    let push_value = |s: &mut Step, v: Value| {
        s.values.push(v);
        ValueId(s.values.len() as u32 - 1)
    };
    let new_buffer = |s: &mut Step, t: &ir::graph::Tensor| -> Result<Value, String> {
        let bytes = dense_bytes(t.dtype, &t.shape)
            .ok_or_else(|| format!("{} {} {} is too large", t.name, t.shape, t.dtype))?;
        s.buffers.push(Buffer {
            name: t.name.clone(),
            bytes,
            offset: None,
        });
        let b = BufferId(s.buffers.len() as u32 - 1);
        Ok(Value::dense(
            t.name.clone(),
            t.dtype,
            t.shape,
            Base::Arena(b),
        ))
    };
    let windows = g.cache_windows();
    // Inputs.
    for (i, t) in g.tensors.iter().enumerate() {
        let Def::Input(kind) = &t.def else { continue };
        let v = match kind {
            Input::Weight => {
                let id = weight_id(plan, t)?;
                Value::dense(t.name.clone(), t.dtype, t.shape, Base::Weight(id))
            }
            Input::KvCache { layer, kind } => {
                let id = kv_id(plan, t, *layer, *kind, windows.get(&i).copied())?;
                Value::dense(t.name.clone(), t.dtype, t.shape, Base::Kv(id))
            }
            Input::Tokens | Input::Positions | Input::OutputIds | Input::Data => {
                let v = new_buffer(&mut s, t)?;
                let id = push_value(&mut s, v);
                s.inputs.push(StepInput {
                    kind: kind.clone(),
                    value: id,
                });
                val[i] = Some(id);
                continue;
            }
        };
        val[i] = Some(push_value(&mut s, v));
    }
    // Nodes.
    for node in &g.nodes {
        let t = g.tensor(node.out);
        let mut srcs = Vec::with_capacity(node.srcs.len());
        for x in &node.srcs {
            srcs.push(val[x.index()].ok_or_else(|| {
                format!(
                    "{} reads {} before it is defined",
                    t.name,
                    g.tensor(*x).name
                )
            })?);
        }
        let src0 = s.values[srcs[0].index()].clone();
        let derived = |shape, nb, offset| Value {
            name: t.name.clone(),
            dtype: t.dtype,
            shape,
            base: src0.base,
            offset,
            nb,
        };
        let out = match &node.op {
            Op::Reshape { .. } => {
                if !src0.is_contiguous() {
                    return Err(format!(
                        "reshape {} of non-contiguous {}",
                        t.name, src0.name
                    ));
                }
                push_value(
                    &mut s,
                    derived(t.shape, contiguous_nb(t.dtype, &t.shape), src0.offset),
                )
            }
            Op::View { nb, offset, .. } => {
                let off = src0
                    .offset
                    .checked_add(*offset)
                    .ok_or_else(|| format!("view {} offset overflows", t.name))?;
                push_value(&mut s, derived(t.shape, *nb, off))
            }
            Op::Permute { axes } => {
                let mut nb = [0u64; MAX_DIMS];
                for (d, &a) in axes.iter().enumerate() {
                    nb[a as usize] = src0.nb[d];
                }
                push_value(&mut s, derived(t.shape, nb, src0.offset))
            }
            op => {
                let v = if op.in_place_src() == Some(0) {
                    Value {
                        name: t.name.clone(),
                        ..src0
                    }
                } else {
                    new_buffer(&mut s, t)?
                };
                let id = push_value(&mut s, v);
                s.kernels.push(Kernel {
                    name: t.name.clone(),
                    op: KernelOp::Op(op.clone()),
                    srcs,
                    dsts: vec![id],
                    nodes: vec![t.name.clone()],
                    target: None,
                });
                id
            }
        };
        val[node.out.index()] = Some(out);
    }
    for o in &g.outputs {
        let id = val[o.index()].ok_or("an output is not defined")?;
        if !matches!(s.values[id.index()].base, Base::Arena(_)) {
            return Err(format!(
                "output {} is not computed in the arena",
                s.values[id.index()].name
            ));
        }
        s.outputs.push(id);
    }
    Ok(s)
}

fn weight_id(plan: &mut Plan, t: &ir::graph::Tensor) -> Result<WeightId, String> {
    if let Some(id) = plan.weight(&t.name) {
        let w = &plan.weights[id.index()];
        if w.dtype != t.dtype || w.shape != t.shape {
            return Err(format!(
                "weight {} is {} {} here and {} {} in another step",
                t.name, t.shape, t.dtype, w.shape, w.dtype
            ));
        }
        return Ok(id);
    }
    plan.weights.push(WeightBuf {
        name: t.name.clone(),
        dtype: t.dtype,
        shape: t.shape,
    });
    Ok(WeightId(plan.weights.len() as u32 - 1))
}

fn kv_id(
    plan: &mut Plan,
    t: &ir::graph::Tensor,
    layer: u32,
    kind: ir::graph::KvKind,
    window: Option<u32>,
) -> Result<KvId, String> {
    if let Some(i) = plan.kv.iter().position(|c| c.name == t.name) {
        let c = &plan.kv[i];
        if c.dtype != t.dtype
            || c.shape != t.shape
            || c.layer != layer
            || c.kind != kind
            || c.window != window
        {
            return Err(format!(
                "KV cache {} differs between steps ({} {} vs {} {})",
                t.name, t.shape, t.dtype, c.shape, c.dtype
            ));
        }
        return Ok(KvId(i as u32));
    }
    plan.kv.push(KvBuf {
        name: t.name.clone(),
        layer,
        kind,
        dtype: t.dtype,
        shape: t.shape,
        window,
    });
    Ok(KvId(plan.kv.len() as u32 - 1))
}
