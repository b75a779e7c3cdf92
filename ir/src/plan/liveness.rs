//! Live ranges of arena buffers over a step's kernel list.
//!
//! Time is counted in *slots*: slot 0 is before the first kernel (the caller has written the
//! step inputs), slot `k + 1` is kernel `k`, slot `n + 1` is after the last kernel (the caller
//! reads the outputs). A buffer is live from the first slot that writes it to the last slot
//! that reads it, both included: a kernel's sources and results are live at its slot together,
//! so a kernel never writes over what it reads, unless they are one buffer (in place).

use super::types::{Base, BufferId, Step};

/// First and last slot (inclusive) at which a buffer holds a value someone needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Live {
    /// Slot of the first write (0 for a step input).
    pub first: usize,
    /// Slot of the last read (`n_kernels + 1` for a step output).
    pub last: usize,
}

impl Live {
    /// Whether two live ranges share a slot.
    pub fn overlaps(&self, other: &Live) -> bool {
        self.first <= other.last && other.first <= self.last
    }
}

/// The live range of every arena buffer of `step` (`None` for a buffer no kernel, input or
/// output touches). Values whose base is not an arena buffer are ignored; ids are assumed in
/// range (run [`super::Plan::verify`] on untrusted plans first).
pub fn liveness(step: &Step) -> Vec<Option<Live>> {
    let mut live: Vec<Option<Live>> = vec![None; step.buffers.len()];
    let buf = |v: super::ValueId| match step.values.get(v.index()).map(|x| x.base) {
        Some(Base::Arena(b)) if b.index() < step.buffers.len() => Some(b),
        _ => None,
    };
    let mut touch = |b: BufferId, slot: usize| {
        let l = &mut live[b.index()];
        *l = Some(match *l {
            None => Live {
                first: slot,
                last: slot,
            },
            Some(x) => Live {
                first: x.first.min(slot),
                last: x.last.max(slot),
            },
        });
    };
    for i in &step.inputs {
        if let Some(b) = buf(i.value) {
            touch(b, 0);
        }
    }
    for (k, kernel) in step.kernels.iter().enumerate() {
        for v in kernel.srcs.iter().chain(&kernel.dsts) {
            if let Some(b) = buf(*v) {
                touch(b, k + 1);
            }
        }
    }
    let end = step.kernels.len() + 1;
    for o in &step.outputs {
        if let Some(b) = buf(*o) {
            touch(b, end);
        }
    }
    live
}
