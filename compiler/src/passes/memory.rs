//! Pass `plan-memory`: static memory planning of one step's arena.
//!
//! Design
//! ======
//!
//! Input: a step whose kernels are in their final order and whose arena buffers have sizes
//! (at the bound of the KV length) but no offsets. Output: every buffer has an offset, and
//! `arena_bytes` is the size of the one allocation the step runs in. Weights and KV caches
//! are not in the arena (the weights stay in the mapped GGUF; the caches persist across
//! steps).
//!
//! Stages:
//!
//! 1. **Liveness** ([`ir::plan::liveness`]). Time is counted in slots: 0 before the first
//!    kernel (the caller writes the step inputs), `k + 1` for kernel `k`, `n + 1` after the
//!    last (the caller reads the outputs). A buffer is live from the slot of its first write
//!    to the slot of its last read, both included, so what a kernel reads and what it writes
//!    are live together at its slot.
//! 2. **In-place reuse.** Walking the kernels in order: when a kernel's result is a whole
//!    fresh buffer `D` and one of its sources is a whole buffer `S` of the same layout whose
//!    last read is this kernel, and the op allows that result to overwrite that source
//!    ([`ir::plan::KernelOp::may_alias`]: elementwise and row-wise ops, a product's residual),
//!    `D` is merged into `S`: every value of `D` now views `S`, and `S` lives on until `D`'s
//!    last read. `S` must not be a step input or output, and no other source of the kernel may
//!    live in `S`. The residual stream thus stays in one buffer through all layers.
//! 3. **Offsets**, greedy by size: buffers sorted by decreasing size (then by first slot),
//!    each placed at the lowest aligned offset where it overlaps no already placed buffer
//!    whose live range meets its own. Large buffers placed first pack well; this is the usual
//!    heuristic for static arenas (TFLite's and TVM's planners use the same idea).
//! 4. **Arena size**: the end of the highest buffer, rounded up to the alignment.
//!
//! Invariants after the pass (checked by [`ir::plan::Plan::verify`]): every offset is a
//! multiple of the alignment and inside the arena; two buffers whose live ranges share a slot
//! share no byte; a kernel's result overlaps one of its sources only as the same view and
//! where the op allows it. Kernel order, values' shapes and strides are unchanged, so the
//! results are the same bit for bit ([`ir::plan::exec`] runs the kernels in this arena).

use ir::plan::liveness::{liveness, Live};
use ir::plan::{Base, BufferId, Step};

/// Plans the arena of `step` with offsets aligned to `align` bytes (see the module doc).
/// Already planned offsets are recomputed.
pub fn plan_memory(step: &mut Step, align: u64) {
    reuse_in_place(step);
    super::fuse::rewrite::compact(step);
    assign_offsets(step, align.max(1));
}

/// Stage 2: merges results into dying sources where the op allows it.
fn reuse_in_place(step: &mut Step) {
    let mut live = liveness(step);
    let is_input: Vec<bool> = {
        let mut v = vec![false; step.buffers.len()];
        for i in &step.inputs {
            if let Base::Arena(b) = step.value(i.value).base {
                v[b.index()] = true;
            }
        }
        v
    };
    let whole = |step: &Step, id: ir::plan::ValueId| -> Option<BufferId> {
        let v = step.value(id);
        match v.base {
            Base::Arena(b)
                if v.offset == 0
                    && v.is_contiguous()
                    && ir::plan::dense_bytes(v.dtype, &v.shape)
                        == Some(step.buffers[b.index()].bytes) =>
            {
                Some(b)
            }
            _ => None,
        }
    };
    for k in 0..step.kernels.len() {
        let slot = k + 1;
        for j in 0..step.kernels[k].dsts.len() {
            let dst = step.kernels[k].dsts[j];
            let Some(d) = whole(step, dst) else { continue };
            if live[d.index()].map(|l| l.first) != Some(slot) || is_input[d.index()] {
                continue;
            }
            let srcs = step.kernels[k].srcs.clone();
            let pick = (0..srcs.len()).find_map(|i| {
                let s = whole(step, srcs[i])?;
                let ok = s != d
                    && step.kernels[k].op.may_alias(i, j)
                    && !is_input[s.index()]
                    && live[s.index()].map(|l| l.last) == Some(slot)
                    && step.value(srcs[i]).dtype == step.value(dst).dtype
                    && step.value(srcs[i]).shape == step.value(dst).shape
                    && srcs
                        .iter()
                        .enumerate()
                        .all(|(o, v)| o == i || step.value(*v).base != Base::Arena(s))
                    && step.kernels[k]
                        .dsts
                        .iter()
                        .all(|v| step.value(*v).base != Base::Arena(s));
                ok.then_some(s)
            });
            let Some(s) = pick else { continue };
            for v in &mut step.values {
                if v.base == Base::Arena(d) {
                    v.base = Base::Arena(s);
                }
            }
            let (ls, ld) = (live[s.index()], live[d.index()]);
            if let (Some(ls), Some(ld)) = (ls, ld) {
                live[s.index()] = Some(Live {
                    first: ls.first,
                    last: ls.last.max(ld.last),
                });
            }
            live[d.index()] = None;
        }
    }
}

/// Stages 3 and 4: offsets and arena size.
fn assign_offsets(step: &mut Step, align: u64) {
    let live = liveness(step);
    let mut order: Vec<usize> = (0..step.buffers.len()).collect();
    order.sort_by_key(|&i| {
        (
            std::cmp::Reverse(step.buffers[i].bytes),
            live[i].map_or(0, |l| l.first),
            i,
        )
    });
    let mut placed: Vec<(u64, u64, Live)> = Vec::new();
    let mut arena = 0u64;
    for i in order {
        let bytes = step.buffers[i].bytes;
        let Some(li) = live[i] else {
            step.buffers[i].offset = Some(0);
            continue;
        };
        let mut conflicts: Vec<(u64, u64)> = placed
            .iter()
            .filter(|(_, _, l)| l.overlaps(&li))
            .map(|&(a, b, _)| (a, b))
            .collect();
        conflicts.sort_unstable();
        let mut off = 0u64;
        for (a, b) in conflicts {
            if off + bytes <= a {
                break;
            }
            off = off.max(b.next_multiple_of(align));
        }
        step.buffers[i].offset = Some(off);
        placed.push((off, off + bytes, li));
        arena = arena.max(off + bytes);
    }
    step.arena_bytes = arena.next_multiple_of(align);
}
