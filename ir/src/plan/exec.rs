//! A plain reference executor of a [`Plan`]: the oracle for the passes (a plan must compute
//! what its graph computes) and for the memory plan (kernels really share one arena here).
//!
//! Each kernel runs as its expansion ([`KernelOp::expand`]) on the interpreter: the
//! executor writes the expansion as a small graph whose inputs are the kernel's operands
//! (arena buffers as [`Input::Data`] seen through a `view` with the value's offset and
//! strides, weights by GGUF name, KV caches by name, token ids and positions from the step
//! inputs) and runs it with [`Interpreter::run`]. So every op is computed by the
//! interpreter's own code, in the expansion's order: a plan whose fusions keep the op order
//! gives bit-identical results. The KV caches live in the interpreter's state across steps.
//!
//! All arena values are F32 (step inputs I32). Each step runs in one arena of words: at the
//! planned offsets, or, for a step not yet planned, with every buffer at its own place.

use super::kernel::Slot;
use super::types::{Base, BufferId, Plan, Step, Value};
use super::PlanError;
use crate::graph::{DType, Graph, Input, TensorId};
use crate::interp::{Inputs, InterpOptions, Interpreter, WeightSource};
use std::collections::HashMap;

/// The non-weight inputs of one step.
#[derive(Clone, Copy, Debug, Default)]
pub struct StepArgs<'a> {
    /// Token ids, `n_tokens` of them.
    pub tokens: &'a [i32],
    /// Positions, `n_tokens` of them.
    pub positions: &'a [i32],
    /// Rows that produce logits, `n_outputs` of them.
    pub output_ids: &'a [i32],
    /// The KV length: one past the last position of the step.
    pub kv_len: u64,
}

/// One kernel written as a graph for the interpreter.
struct KernelGraph {
    graph: Graph,
    /// Arena buffers fed as data inputs, by input name.
    data: Vec<(String, BufferId)>,
    /// Computed I32 arena values (selected experts) fed as I32 data inputs, by input name.
    ints: Vec<(String, Value)>,
    /// For each graph output (in order), the kernel result it is.
    outs: Vec<usize>,
}

/// Runs the steps of a plan with the interpreter's op implementations (module doc).
pub struct PlanExec<'p, 'w> {
    plan: &'p Plan,
    interp: Interpreter<'w>,
    /// Word offset of each buffer of each step.
    offsets: Vec<Vec<usize>>,
    arena: Vec<u32>,
    graphs: HashMap<(usize, usize), KernelGraph>,
}

fn err(s: &Step, k: usize, msg: impl std::fmt::Display) -> PlanError {
    let name = s.kernels.get(k).map_or("?", |x| x.name.as_str());
    PlanError::Exec(format!(
        "step n_tokens={} kernel {k} {name}: {msg}",
        s.n_tokens
    ))
}

impl<'p, 'w> PlanExec<'p, 'w> {
    /// An executor for `plan` reading weights from `weights`, with empty KV caches.
    ///
    /// # Errors
    /// [`PlanError::Invalid`] if the plan does not verify; [`PlanError::Exec`] if an arena
    /// value is not F32 / I32 or the arena does not fit in memory.
    pub fn new(
        plan: &'p Plan,
        weights: &'w dyn WeightSource,
        opts: InterpOptions,
    ) -> Result<Self, PlanError> {
        plan.verify()?;
        let mut offsets = Vec::new();
        let mut words = 0usize;
        for s in &plan.steps {
            if let Some(v) = s.values.iter().find(|v| {
                matches!(v.base, Base::Arena(_)) && !matches!(v.dtype, DType::F32 | DType::I32)
            }) {
                return Err(PlanError::Exec(format!(
                    "arena value {} is {}: the executor takes F32 and I32",
                    v.name, v.dtype
                )));
            }
            let mut offs = Vec::with_capacity(s.buffers.len());
            let mut next = 0u64;
            for b in &s.buffers {
                let off = match b.offset {
                    Some(o) => o,
                    None => {
                        let o = next;
                        next = (next + b.bytes).next_multiple_of(plan.align);
                        o
                    }
                };
                if off % 4 != 0 {
                    return Err(PlanError::Exec(format!(
                        "buffer {} at byte {off} is not word aligned",
                        b.name
                    )));
                }
                let end = usize::try_from((off + b.bytes).div_ceil(4))
                    .map_err(|_| PlanError::Exec("arena too large".into()))?;
                words = words.max(end);
                offs.push((off / 4) as usize);
            }
            offsets.push(offs);
        }
        let mut arena = Vec::new();
        arena.try_reserve_exact(words).map_err(|_| {
            PlanError::Exec(format!(
                "cannot allocate an arena of {} bytes",
                words as u64 * 4
            ))
        })?;
        arena.resize(words, 0);
        Ok(PlanExec {
            plan,
            interp: {
                // Rings: a kernel that stores into a cache does not hold the attention
                // that gives the cache its window.
                let mut i = Interpreter::new(weights, opts);
                i.set_cache_windows(
                    plan.kv
                        .iter()
                        .filter_map(|c| Some((c.name.clone(), c.window?))),
                );
                i
            },
            offsets,
            arena,
            graphs: HashMap::new(),
        })
    }

    /// The interpreter holding the KV caches (to read or clear them).
    pub fn interpreter(&mut self) -> &mut Interpreter<'w> {
        &mut self.interp
    }

    /// Runs the step compiled for `n_tokens` tokens and `n_outputs` logit rows and returns
    /// each step output's actual elements in `ne` order (the logits first).
    ///
    /// # Errors
    /// [`PlanError::Exec`] if no such step exists, if the inputs do not have the step's
    /// lengths, or if a kernel fails (naming the kernel).
    pub fn run(
        &mut self,
        n_tokens: u32,
        n_outputs: u32,
        args: &StepArgs<'_>,
    ) -> Result<Vec<Vec<f32>>, PlanError> {
        let si = self.begin(n_tokens, n_outputs, args)?;
        let s = &self.plan.steps[si];
        for k in 0..s.kernels.len() {
            self.run_kernel(si, k, args.kv_len)?;
        }
        Ok(s.outputs
            .iter()
            .map(|o| self.gather(si, s.value(*o), args.kv_len))
            .collect())
    }

    /// Starts the step for `n_tokens` tokens and `n_outputs` logit rows: writes its inputs
    /// into the arena and returns the step's index, for [`PlanExec::run_kernel`] (a
    /// kernel-by-kernel run: how a backend's kernels are each compared with the
    /// interpreter's on the same inputs).
    ///
    /// # Errors
    /// As [`PlanExec::run`].
    pub fn begin(
        &mut self,
        n_tokens: u32,
        n_outputs: u32,
        args: &StepArgs<'_>,
    ) -> Result<usize, PlanError> {
        let si = self
            .plan
            .steps
            .iter()
            .position(|s| s.n_tokens == n_tokens && s.n_outputs == n_outputs)
            .ok_or_else(|| {
                PlanError::Exec(format!(
                    "no step for {n_tokens} tokens and {n_outputs} outputs"
                ))
            })?;
        let s = &self.plan.steps[si];
        for inp in &s.inputs {
            let src: &[i32] = match inp.kind {
                Input::Tokens => args.tokens,
                Input::Positions => args.positions,
                Input::OutputIds => args.output_ids,
                _ => {
                    return Err(PlanError::Exec(format!(
                        "step input {:?} cannot be given",
                        inp.kind
                    )))
                }
            };
            let v = s.value(inp.value);
            if src.len() as u64 != v.shape.ne[0] {
                return Err(PlanError::Exec(format!(
                    "{:?}: the step takes {} values, got {}",
                    inp.kind,
                    v.shape.ne[0],
                    src.len()
                )));
            }
            let at = self.word(si, v);
            for (i, x) in src.iter().enumerate() {
                self.arena[at + i] = *x as u32;
            }
        }
        Ok(si)
    }

    /// The arena as words: byte `4 i` of the step's arena is word `i` (a planned step's
    /// buffers lie at their planned offsets).
    pub fn arena(&self) -> &[u32] {
        &self.arena
    }

    /// The actual elements of arena value `v` of step `si` in `ne` order (empty for a value
    /// outside the arena).
    pub fn value(&self, si: usize, v: &Value, kv_len: u64) -> Vec<f32> {
        self.gather(si, v, kv_len)
    }

    fn word(&self, si: usize, v: &Value) -> usize {
        match v.base {
            Base::Arena(b) => self.offsets[si][b.index()] + (v.offset / 4) as usize,
            _ => 0,
        }
    }

    /// The actual elements of arena value `v` in `ne` order.
    fn gather(&self, si: usize, v: &Value, kv_len: u64) -> Vec<f32> {
        let mut out = Vec::new();
        let base = match v.base {
            Base::Arena(b) => self.offsets[si][b.index()] as u64 * 4,
            _ => return out,
        };
        for_each(v, kv_len, |byte| {
            out.push(f32::from_bits(self.arena[((base + byte) / 4) as usize]))
        });
        out
    }

    /// Runs kernel `k` of step `si` (see [`PlanExec::begin`]) over the arena as it is.
    ///
    /// # Errors
    /// What the interpreter reports, naming the kernel.
    pub fn run_kernel(&mut self, si: usize, k: usize, kv_len: u64) -> Result<(), PlanError> {
        if self.plan.steps.get(si).is_none_or(|s| k >= s.kernels.len()) {
            return Err(PlanError::Exec(format!("no kernel {k} in step {si}")));
        }
        let plan = self.plan;
        let s = &plan.steps[si];
        if let std::collections::hash_map::Entry::Vacant(e) = self.graphs.entry((si, k)) {
            e.insert(kernel_graph(plan, s, k).map_err(|m| err(s, k, m))?);
        }
        let kg = &self.graphs[&(si, k)];
        let int_input = |kind: Input| -> Vec<i32> {
            s.input(&kind).map_or(Vec::new(), |id| {
                let v = s.value(id);
                let at = self.word(si, v);
                self.arena[at..at + v.shape.ne[0] as usize]
                    .iter()
                    .map(|&w| w as i32)
                    .collect()
            })
        };
        let (tokens, positions, output_ids) = (
            int_input(Input::Tokens),
            int_input(Input::Positions),
            int_input(Input::OutputIds),
        );
        let mut bufs = Vec::with_capacity(kg.data.len());
        for (_, b) in &kg.data {
            let off = self.offsets[si][b.index()];
            let n = (s.buffers[b.index()].bytes / 4) as usize;
            bufs.push(
                self.arena[off..off + n]
                    .iter()
                    .map(|&w| f32::from_bits(w))
                    .collect::<Vec<f32>>(),
            );
        }
        let ints: Vec<Vec<f32>> = kg
            .ints
            .iter()
            .map(|(_, v)| self.gather(si, v, kv_len))
            .collect();
        let data: Vec<(&str, &[f32])> = kg
            .data
            .iter()
            .zip(&bufs)
            .map(|((n, _), b)| (n.as_str(), b.as_slice()))
            .chain(
                kg.ints
                    .iter()
                    .zip(&ints)
                    .map(|((n, _), b)| (n.as_str(), b.as_slice())),
            )
            .collect();
        let inputs = Inputs {
            tokens: &tokens,
            positions: &positions,
            output_ids: &output_ids,
            kv_len,
            data: &data,
        };
        let outs = self
            .interp
            .run(&kg.graph, &inputs)
            .map_err(|e| err(s, k, e))?;
        for (vals, &j) in outs.iter().zip(&kg.outs) {
            let v = s.value(s.kernels[k].dsts[j]);
            let base = self.word(si, v) as u64 * 4 - v.offset;
            let mut it = vals.iter();
            let arena = &mut self.arena;
            for_each(v, kv_len, |byte| {
                if let Some(x) = it.next() {
                    arena[((base + byte) / 4) as usize] = x.to_bits();
                }
            });
        }
        Ok(())
    }
}

/// Calls `f(byte)` with the byte offset (from the start of the base) of each actual element
/// of F32/I32 value `v`, in `ne` order.
fn for_each(v: &Value, kv_len: u64, mut f: impl FnMut(u64)) {
    let ne = v.shape.resolve(kv_len);
    for i3 in 0..ne[3] {
        for i2 in 0..ne[2] {
            for i1 in 0..ne[1] {
                let row = v.offset + i1 * v.nb[1] + i2 * v.nb[2] + i3 * v.nb[3];
                for i0 in 0..ne[0] {
                    f(row + i0 * v.nb[0]);
                }
            }
        }
    }
}

/// Builds the graph of kernel `k` of step `s` (see the module doc).
fn kernel_graph(plan: &Plan, s: &Step, k: usize) -> Result<KernelGraph, String> {
    let kernel = &s.kernels[k];
    let mut g = Graph::new();
    let mut data = Vec::new();
    let mut ints = Vec::new();
    let mut buf_inputs: HashMap<BufferId, TensorId> = HashMap::new();
    let mut kv_inputs: HashMap<super::KvId, TensorId> = HashMap::new();
    let mut operand = |g: &mut Graph, v: &Value| -> Result<TensorId, String> {
        let (whole, dtype, shape) = match v.base {
            Base::Arena(b) => {
                if v.dtype == DType::I32 {
                    let kind = s
                        .inputs
                        .iter()
                        .find(|i| s.value(i.value).same_view(v))
                        .map(|i| i.kind.clone());
                    let Some(kind) = kind else {
                        // A computed I32 value: its elements, gathered from the arena.
                        let name = format!("ints{}", ints.len());
                        ints.push((name.clone(), v.clone()));
                        return Ok(g.input(name, Input::Data, DType::I32, v.shape));
                    };
                    return Ok(g.input(v.name.clone(), kind, DType::I32, v.shape));
                }
                let t = match buf_inputs.get(&b) {
                    Some(t) => *t,
                    None => {
                        let name = format!("buf{}", b.0);
                        let n = s.buffers[b.index()].bytes / 4;
                        let t = g.input(
                            name.clone(),
                            Input::Data,
                            DType::F32,
                            crate::graph::Shape::new(&[n]),
                        );
                        data.push((name, b));
                        buf_inputs.insert(b, t);
                        t
                    }
                };
                return g
                    .view(&v.name, t, v.shape, v.nb, v.offset)
                    .map_err(|e| e.to_string());
            }
            Base::Weight(w) => {
                let w = &plan.weights[w.index()];
                (g.weight(&w.name, w.dtype, w.shape), w.dtype, w.shape)
            }
            Base::Kv(id) => {
                let c = &plan.kv[id.index()];
                let kind = Input::KvCache {
                    layer: c.layer,
                    kind: c.kind,
                };
                let t = *kv_inputs
                    .entry(id)
                    .or_insert_with(|| g.input(c.name.clone(), kind, c.dtype, c.shape));
                (t, c.dtype, c.shape)
            }
        };
        if v.offset == 0 && v.shape == shape && v.is_contiguous() && v.dtype == dtype {
            Ok(whole)
        } else {
            g.view(&v.name, whole, v.shape, v.nb, v.offset)
                .map_err(|e| e.to_string())
        }
    };
    let mut srcs = Vec::new();
    for id in &kernel.srcs {
        srcs.push(operand(&mut g, s.value(*id))?);
    }
    let mut dsts: Vec<Option<TensorId>> = vec![None; kernel.dsts.len()];
    let ty = |v: &Value| crate::graph::SrcType {
        dtype: v.dtype,
        shape: v.shape,
        contiguous: v.is_contiguous(),
    };
    let st: Vec<_> = kernel.srcs.iter().map(|i| ty(s.value(*i))).collect();
    let dt: Vec<_> = kernel.dsts.iter().map(|i| ty(s.value(*i))).collect();
    let exp = kernel.op.expand(&st, &dt)?;
    let mut tmps: Vec<Option<TensorId>> = vec![None; exp.tmps.len()];
    for (n, m) in exp.ops.iter().enumerate() {
        let mut ins = Vec::with_capacity(m.srcs.len());
        for slot in &m.srcs {
            ins.push(match *slot {
                Slot::Src(i) => srcs[i],
                Slot::Tmp(i) => tmps[i].ok_or("temporary read before it is written")?,
                Slot::Dst(j) => match dsts[j] {
                    Some(t) => t,
                    None => {
                        let t = operand(&mut g, s.value(kernel.dsts[j]))?;
                        dsts[j] = Some(t);
                        t
                    }
                },
            });
        }
        let name = match m.out {
            Slot::Dst(j) => s.value(kernel.dsts[j]).name.clone(),
            _ => format!("{}.{n}", kernel.name),
        };
        let t = g.op(name, m.op.clone(), &ins).map_err(|e| e.to_string())?;
        match m.out {
            Slot::Dst(j) => dsts[j] = Some(t),
            Slot::Tmp(i) => tmps[i] = Some(t),
            Slot::Src(_) => return Err("an expansion writes a source".into()),
        }
    }
    let mut outs = Vec::new();
    for (j, id) in kernel.dsts.iter().enumerate() {
        let v = s.value(*id);
        let t = dsts[j].ok_or_else(|| format!("result {} is never written", v.name))?;
        if matches!(v.base, Base::Arena(_)) {
            g.mark_output(t);
            outs.push(j);
        }
    }
    Ok(KernelGraph {
        graph: g,
        data,
        ints,
        outs,
    })
}
