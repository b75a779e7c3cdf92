//! The machinery every fusion pass shares: who reads and writes each location, replacing a
//! group of kernels by one fused kernel when that is safe, and dropping what no kernel uses.
//!
//! Locations are arena buffers, KV caches and weights ([`Base`]). Before memory planning
//! every arena buffer is written by one kernel (or is a step input), so most hazards come
//! from the KV caches, which stores update in place and attention reads.

use ir::graph::Op;
use ir::plan::{Base, Epilogue, Kernel, KernelOp, MulMatSpec, Step, Value, ValueId};

/// Readers and writers (kernel indices, ascending) of each location of a step.
pub struct Uses {
    /// Index of the first weight and of the first KV cache in the tables below (arena
    /// buffers come first).
    weights_at: usize,
    kv_at: usize,
    readers: Vec<Vec<usize>>,
    writers: Vec<Vec<usize>>,
    outputs: Vec<Base>,
}

impl Uses {
    /// The uses in `step` as it is now.
    pub fn of(step: &Step) -> Uses {
        let (mut n_w, mut n_kv) = (0, 0);
        for v in &step.values {
            match v.base {
                Base::Weight(w) => n_w = n_w.max(w.index() + 1),
                Base::Kv(c) => n_kv = n_kv.max(c.index() + 1),
                Base::Arena(_) => {}
            }
        }
        let n = step.buffers.len() + n_w + n_kv;
        let mut u = Uses {
            weights_at: step.buffers.len(),
            kv_at: step.buffers.len() + n_w,
            readers: vec![Vec::new(); n],
            writers: vec![Vec::new(); n],
            outputs: step.outputs.iter().map(|o| step.value(*o).base).collect(),
        };
        for (k, kernel) in step.kernels.iter().enumerate() {
            for s in &kernel.srcs {
                let i = u.index(step.value(*s).base);
                if u.readers[i].last() != Some(&k) {
                    u.readers[i].push(k);
                }
            }
            for d in &kernel.dsts {
                let i = u.index(step.value(*d).base);
                if u.writers[i].last() != Some(&k) {
                    u.writers[i].push(k);
                }
            }
        }
        u
    }

    fn index(&self, b: Base) -> usize {
        match b {
            Base::Arena(x) => x.index(),
            Base::Weight(x) => self.weights_at + x.index(),
            Base::Kv(x) => self.kv_at + x.index(),
        }
    }

    /// Kernels reading `b`.
    pub fn readers(&self, b: Base) -> &[usize] {
        self.readers
            .get(self.index(b))
            .map_or(&[], |v| v.as_slice())
    }

    /// Kernels writing `b`.
    pub fn writers(&self, b: Base) -> &[usize] {
        self.writers
            .get(self.index(b))
            .map_or(&[], |v| v.as_slice())
    }

    /// Whether `b` holds a step output.
    pub fn is_output(&self, b: Base) -> bool {
        self.outputs.contains(&b)
    }

    /// The only kernel writing `b`, if exactly one does.
    pub fn producer(&self, b: Base) -> Option<usize> {
        match self.writers(b) {
            [k] => Some(*k),
            _ => None,
        }
    }
}

/// Replaces the kernels `group` (ascending indices) of `step` by `new`, at the last member's
/// place or, if that is not safe, at the first's. Returns whether it did.
///
/// Safe means: `new` reads nothing a member writes (the members' chain is computed inside
/// it); whatever a member writes that `new` does not is read by no one else and is no step
/// output; and every kernel between the first and the last member that depends on a member
/// (reads what it writes, or writes what it reads or writes) keeps its order relative to that
/// member once the member's work moves to the chosen place.
pub fn replace_group(step: &mut Step, uses: &Uses, group: &[usize], new: Kernel) -> bool {
    debug_assert!(group.windows(2).all(|w| w[0] < w[1]));
    let (Some(&first), Some(&last)) = (group.first(), group.last()) else {
        return false;
    };
    let inside = |k: &usize| group.contains(k);
    let loc = |v: &ValueId| step.value(*v).base;
    let dst_locs: Vec<Base> = new.dsts.iter().map(loc).collect();
    if new
        .srcs
        .iter()
        .any(|v| uses.writers(loc(v)).iter().any(inside))
    {
        return false;
    }
    for &k in group {
        for d in &step.kernels[k].dsts {
            let l = loc(d);
            if !dst_locs.contains(&l)
                && (uses.is_output(l) || uses.readers(l).iter().any(|r| !inside(r)))
            {
                return false;
            }
        }
    }
    let depends = |r: usize, m: usize| {
        let (kr, km) = (&step.kernels[r], &step.kernels[m]);
        let m_writes: Vec<Base> = km.dsts.iter().map(loc).collect();
        kr.srcs.iter().any(|v| m_writes.contains(&loc(v)))
            || kr.dsts.iter().any(|v| {
                let l = loc(v);
                m_writes.contains(&l) || km.srcs.iter().any(|s| loc(s) == l)
            })
    };
    let keeps_order = |place: usize| {
        (first + 1..last).filter(|r| !inside(r)).all(|r| {
            group
                .iter()
                .all(|&m| !depends(r, m) || ((r < m) == (r < place)))
        })
    };
    let place = if keeps_order(last) {
        last
    } else if keeps_order(first) {
        first
    } else {
        return false;
    };
    step.kernels[place] = new;
    for &k in group.iter().rev() {
        if k != place {
            step.kernels.remove(k);
        }
    }
    true
}

/// Runs `find` at each kernel index; where it proposes a group and its fused kernel and
/// [`replace_group`] accepts, the step is rewritten and the scan goes on from the same index.
/// Drops unused values and buffers at the end.
pub fn rewrite_all(
    step: &mut Step,
    mut find: impl FnMut(&Step, &Uses, usize) -> Vec<(Vec<usize>, Kernel)>,
) {
    let mut uses = Uses::of(step);
    let mut k = 0;
    while k < step.kernels.len() {
        let mut applied = false;
        for (group, new) in find(step, &uses, k) {
            if replace_group(step, &uses, &group, new) {
                applied = true;
                break;
            }
        }
        if applied {
            uses = Uses::of(step);
        } else {
            k += 1;
        }
    }
    compact(step);
}

/// Removes values no kernel, input or output uses, and buffers no value uses; renumbers.
pub fn compact(step: &mut Step) {
    let mut used = vec![false; step.values.len()];
    for k in &step.kernels {
        for v in k.srcs.iter().chain(&k.dsts) {
            used[v.index()] = true;
        }
    }
    for v in step.inputs.iter().map(|i| &i.value).chain(&step.outputs) {
        used[v.index()] = true;
    }
    let mut vmap = vec![ValueId(u32::MAX); step.values.len()];
    let mut values = Vec::new();
    for (i, v) in step.values.iter().enumerate() {
        if used[i] {
            vmap[i] = ValueId(values.len() as u32);
            values.push(v.clone());
        }
    }
    let mut bused = vec![false; step.buffers.len()];
    for v in &values {
        if let Base::Arena(b) = v.base {
            bused[b.index()] = true;
        }
    }
    let mut bmap = vec![u32::MAX; step.buffers.len()];
    let mut buffers = Vec::new();
    for (i, b) in step.buffers.iter().enumerate() {
        if bused[i] {
            bmap[i] = buffers.len() as u32;
            buffers.push(b.clone());
        }
    }
    for v in &mut values {
        if let Base::Arena(b) = &mut v.base {
            b.0 = bmap[b.index()];
        }
    }
    for k in &mut step.kernels {
        for v in k.srcs.iter_mut().chain(k.dsts.iter_mut()) {
            *v = vmap[v.index()];
        }
    }
    for i in &mut step.inputs {
        i.value = vmap[i.value.index()];
    }
    for o in &mut step.outputs {
        *o = vmap[o.index()];
    }
    step.values = values;
    step.buffers = buffers;
}

/// A matrix-product kernel seen uniformly: a plain `mul_mat` of a weight and an activation,
/// or a [`KernelOp::MulMat`].
#[derive(Clone, Debug)]
pub struct Mm {
    /// Its spec (`n_mat = 1`, no norm, no epilogue for a plain `mul_mat`).
    pub spec: MulMatSpec,
    /// The input activation.
    pub x: ValueId,
    /// The norm weight, if the spec has a norm.
    pub norm_w: Option<ValueId>,
    /// The weights.
    pub ws: Vec<ValueId>,
    /// The added operand, for [`Epilogue::Add`].
    pub r: Option<ValueId>,
}

impl Mm {
    /// The matrix product `kernel` computes, if it is one with weights as first operands.
    pub fn of(step: &Step, kernel: &Kernel) -> Option<Mm> {
        let is_weight = |v: &ValueId| matches!(step.value(*v).base, Base::Weight(_));
        match &kernel.op {
            KernelOp::Op(Op::MulMat)
                if is_weight(&kernel.srcs[0]) && !is_weight(&kernel.srcs[1]) =>
            {
                Some(Mm {
                    spec: MulMatSpec {
                        norm: None,
                        n_mat: 1,
                        epilogue: Epilogue::None,
                    },
                    x: kernel.srcs[1],
                    norm_w: None,
                    ws: vec![kernel.srcs[0]],
                    r: None,
                })
            }
            KernelOp::MulMat(spec) => {
                let mut it = kernel.srcs.iter().copied();
                let x = it.next()?;
                let norm_w = if spec.norm.is_some() {
                    Some(it.next()?)
                } else {
                    None
                };
                let ws: Vec<ValueId> = it.by_ref().take(spec.n_mat as usize).collect();
                let r = if spec.epilogue == Epilogue::Add {
                    Some(it.next()?)
                } else {
                    None
                };
                Some(Mm {
                    spec: *spec,
                    x,
                    norm_w,
                    ws,
                    r,
                })
            }
            _ => None,
        }
    }

    /// Whether it is a bare product (no norm, no epilogue).
    pub fn is_plain(&self) -> bool {
        self.spec.norm.is_none() && self.spec.epilogue == Epilogue::None
    }

    /// The kernel op and sources of this product.
    pub fn op_and_srcs(&self) -> (KernelOp, Vec<ValueId>) {
        let mut srcs = vec![self.x];
        srcs.extend(self.norm_w);
        srcs.extend(&self.ws);
        srcs.extend(self.r);
        let spec = MulMatSpec {
            n_mat: self.ws.len() as u8,
            ..self.spec
        };
        (KernelOp::MulMat(spec), srcs)
    }
}

/// Whether `a` and `b` are the same elements at the same places.
pub fn same(step: &Step, a: ValueId, b: ValueId) -> bool {
    a == b || step.value(a).same_view(step.value(b))
}

/// The graph nodes of `kernels`, in order.
pub fn nodes_of<'a>(kernels: impl IntoIterator<Item = &'a Kernel>) -> Vec<String> {
    kernels
        .into_iter()
        .flat_map(|k| k.nodes.iter().cloned())
        .collect()
}

/// Whether `v` is a whole contiguous F32 vector of `n` values (a norm weight).
pub fn is_vector(v: &Value, n: u64) -> bool {
    v.shape.rank() == 1
        && v.shape.ne[0] == n
        && !v.shape.has_kv()
        && v.dtype == ir::graph::DType::F32
}
