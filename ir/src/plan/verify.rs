//! The plan verifier: what every pass must leave true, and what a plan read from disk must
//! satisfy before a target generates code for it.
//!
//! Shared tables: weights of known size; KV caches `{n_embd_gqa, n_ctx}` of F16 or F32, one
//! per (layer, K/V). Steps in increasing `(n_tokens, n_outputs)`. In each step:
//! - every id in range; every value inside its base (at the bound of the KV length); weight
//!   and KV values keep their table's dtype; arena values are activation types;
//! - inputs are contiguous arena values of the right kind and length;
//! - every kernel's expansion type-checks against its operands ([`KernelOp::expand`]);
//!   results are never weights; only KV stores write KV caches;
//! - no kernel reads an arena buffer before something wrote it;
//! - a result overlaps a source of its kernel only as the same view where the op allows it
//!   ([`KernelOp::may_alias`]), and must where the op updates in place;
//! - once planned: offsets aligned, inside the arena, and two buffers whose live ranges
//!   ([`super::liveness`]) meet share no byte.

use super::kernel::{is_arena_dtype, KernelOp};
use super::liveness::liveness;
use super::types::{Base, Plan, Step, Value, ValueId};
use super::PlanError;
use crate::graph::{DType, Input, Op, SrcType};
use std::collections::HashSet;

impl Plan {
    /// Checks the whole plan (see the module doc of `verify`).
    ///
    /// # Errors
    /// [`PlanError::Invalid`] naming the step and the first kernel, value or buffer that is
    /// wrong, with the types or offsets involved.
    pub fn verify(&self) -> Result<(), PlanError> {
        let bad = |msg: String| Err(PlanError::Invalid { n_tokens: 0, msg });
        if !self.align.is_power_of_two() {
            return bad(format!("alignment {} is not a power of two", self.align));
        }
        for w in &self.weights {
            if w.bytes().is_none() || w.shape.has_kv() {
                return bad(format!(
                    "weight {}: {} {} is not whole blocks",
                    w.name, w.shape, w.dtype
                ));
            }
        }
        let mut seen = HashSet::new();
        for c in &self.kv {
            if !c.dtype.is_cache_type()
                || c.shape.rank() > 2
                || c.shape.has_kv()
                || c.shape.ne[1] != self.n_ctx as u64
                || c.bytes().is_none()
            {
                return bad(format!(
                    "KV cache {}: {} {} is not an F32/F16/Q8_0 {{n_embd_gqa, n_ctx = {}}} matrix",
                    c.name, c.shape, c.dtype, self.n_ctx
                ));
            }
            if !seen.insert((c.layer, c.kind)) {
                return bad(format!(
                    "KV cache {}: layer {} {:?} appears twice",
                    c.name, c.layer, c.kind
                ));
            }
        }
        for w in self.steps.windows(2) {
            if (w[0].n_tokens, w[0].n_outputs) >= (w[1].n_tokens, w[1].n_outputs) {
                return bad(format!(
                    "steps ({}, {}) and ({}, {}) are not in increasing (n_tokens, n_outputs)",
                    w[0].n_tokens, w[0].n_outputs, w[1].n_tokens, w[1].n_outputs
                ));
            }
        }
        for s in &self.steps {
            self.verify_step(s).map_err(|msg| PlanError::Invalid {
                n_tokens: s.n_tokens,
                msg,
            })?;
        }
        Ok(())
    }

    fn base_bytes(&self, step: &Step, b: Base) -> Option<u64> {
        match b {
            Base::Arena(id) => step.buffers.get(id.index()).map(|x| x.bytes),
            Base::Weight(id) => self.weights.get(id.index()).and_then(|w| w.bytes()),
            Base::Kv(id) => self.kv.get(id.index()).and_then(|c| c.bytes()),
        }
    }

    fn verify_step(&self, s: &Step) -> Result<(), String> {
        if s.n_tokens == 0 || s.n_outputs > s.n_tokens {
            return Err(format!("{} outputs of {} tokens", s.n_outputs, s.n_tokens));
        }
        let value = |id: ValueId| -> Result<&Value, String> {
            s.values
                .get(id.index())
                .ok_or_else(|| format!("value {id:?} is not in the step"))
        };
        // Values.
        for v in &s.values {
            let size = self
                .base_bytes(s, v.base)
                .ok_or_else(|| format!("value {}: base {:?} is not in the plan", v.name, v.base))?;
            match v.end() {
                Some(end) if end <= size => {}
                _ => {
                    return Err(format!(
                    "value {}: {} {} at offset {} nb {:?} reaches past its base of {size} bytes",
                    v.name, v.shape, v.dtype, v.offset, v.nb
                ))
                }
            }
            let want = match v.base {
                Base::Weight(w) => Some(self.weights[w.index()].dtype),
                Base::Kv(c) => Some(self.kv[c.index()].dtype),
                Base::Arena(_) => None,
            };
            match want {
                Some(d) if d != v.dtype => {
                    return Err(format!(
                        "value {}: {} view of a {d} tensor",
                        v.name, v.dtype
                    ))
                }
                None if !is_arena_dtype(v.dtype) => {
                    return Err(format!(
                        "value {}: arena values cannot be {}",
                        v.name, v.dtype
                    ))
                }
                _ => {}
            }
        }
        // Buffers: all planned or none; aligned and inside the arena.
        let planned = s.buffers.iter().filter(|b| b.offset.is_some()).count();
        if planned != 0 && planned != s.buffers.len() {
            return Err(format!(
                "{planned} of {} buffers have offsets",
                s.buffers.len()
            ));
        }
        for b in &s.buffers {
            if let Some(off) = b.offset {
                if off % self.align != 0
                    || off.checked_add(b.bytes).is_none_or(|e| e > s.arena_bytes)
                {
                    return Err(format!(
                        "buffer {} at offset {off} ({} bytes) is misaligned or outside the arena of {} bytes",
                        b.name, b.bytes, s.arena_bytes
                    ));
                }
            }
        }
        // Inputs.
        let mut written = vec![false; s.buffers.len()];
        for i in &s.inputs {
            let v = value(i.value)?;
            let Base::Arena(b) = v.base else {
                return Err(format!("input {} is not an arena value", v.name));
            };
            let want_len = match &i.kind {
                Input::Tokens | Input::Positions => Some(s.n_tokens as u64),
                Input::OutputIds => Some(s.n_outputs as u64),
                Input::Data => None,
                k => return Err(format!("input {}: {k:?} cannot be a step input", v.name)),
            };
            if let Some(n) = want_len {
                if v.dtype != DType::I32 || v.shape.rank() != 1 || v.shape.ne[0] != n {
                    return Err(format!(
                        "input {} ({:?}) must be I32 {{{n}}}, is {} {}",
                        v.name, i.kind, v.shape, v.dtype
                    ));
                }
            }
            if !v.is_contiguous() || v.shape.has_kv() {
                return Err(format!(
                    "input {} must be contiguous with fixed shape",
                    v.name
                ));
            }
            written[b.index()] = true;
        }
        // Kernels.
        for (k, kernel) in s.kernels.iter().enumerate() {
            let at = |m: String| format!("kernel {k} {} ({}): {m}", kernel.name, kernel.op.name());
            let mut srcs = Vec::with_capacity(kernel.srcs.len());
            for id in &kernel.srcs {
                let v = value(*id).map_err(&at)?;
                if let Base::Arena(b) = v.base {
                    if !written[b.index()] {
                        return Err(at(format!("reads {} before anything writes it", v.name)));
                    }
                }
                srcs.push(v);
            }
            let mut dsts = Vec::with_capacity(kernel.dsts.len());
            for id in &kernel.dsts {
                dsts.push(value(*id).map_err(&at)?);
            }
            let ty = |v: &&Value| SrcType {
                dtype: v.dtype,
                shape: v.shape,
                contiguous: v.is_contiguous(),
            };
            let st: Vec<SrcType> = srcs.iter().map(ty).collect();
            let dt: Vec<SrcType> = dsts.iter().map(ty).collect();
            kernel.op.expand(&st, &dt).map_err(&at)?;
            for (j, d) in dsts.iter().enumerate() {
                match d.base {
                    Base::Weight(_) => return Err(at(format!("writes weight {}", d.name))),
                    Base::Kv(_) if !writes_kv(&kernel.op, j) => {
                        return Err(at(format!("writes KV cache {} but is no KV store", d.name)))
                    }
                    _ => {}
                }
                if let Some(i) = kernel.op.in_place_src(j) {
                    if !srcs[i].same_view(d) {
                        return Err(at(format!(
                            "result {} must be its source {} in place",
                            d.name, srcs[i].name
                        )));
                    }
                }
                for (i, src) in srcs.iter().enumerate() {
                    if self.may_overlap(s, src, d)
                        && !(src.same_view(d) && kernel.op.may_alias(i, j))
                    {
                        return Err(at(format!(
                            "result {} overlaps source {} where the op cannot work in place",
                            d.name, src.name
                        )));
                    }
                }
                for d2 in &dsts[..j] {
                    if self.may_overlap(s, d2, d) {
                        return Err(at(format!("results {} and {} overlap", d2.name, d.name)));
                    }
                }
                if let Base::Arena(b) = d.base {
                    written[b.index()] = true;
                }
            }
        }
        for o in &s.outputs {
            let v = value(*o)?;
            match v.base {
                Base::Arena(b) if written[b.index()] => {}
                _ => return Err(format!("output {} is not a computed arena value", v.name)),
            }
        }
        if planned > 0 {
            self.verify_disjoint(s)?;
        }
        Ok(())
    }

    /// Whether two values of a step can share a byte (conservative for unplanned arenas:
    /// values of one buffer are compared by their ranges within it).
    fn may_overlap(&self, s: &Step, a: &Value, b: &Value) -> bool {
        let range = |v: &Value| -> (Option<u64>, u64, u64) {
            let start = match v.base {
                Base::Arena(id) => s.buffers[id.index()].offset,
                _ => None,
            };
            (start, v.offset, v.end().unwrap_or(u64::MAX))
        };
        let (sa, a0, a1) = range(a);
        let (sb, b0, b1) = range(b);
        match (a.base, b.base, sa, sb) {
            (Base::Arena(_), Base::Arena(_), Some(x), Some(y)) => {
                x + a0 < y + b1 && y + b0 < x + a1
            }
            (ba, bb, _, _) if ba == bb => a0 < b1 && b0 < a1,
            _ => false,
        }
    }

    fn verify_disjoint(&self, s: &Step) -> Result<(), String> {
        let live = liveness(s);
        let mut items = Vec::new();
        for (i, b) in s.buffers.iter().enumerate() {
            if let (Some(off), Some(l)) = (b.offset, live[i]) {
                items.push((i, off, off + b.bytes, l));
            }
        }
        for (x, &(i, a0, a1, li)) in items.iter().enumerate() {
            for &(j, b0, b1, lj) in &items[x + 1..] {
                if a0 < b1 && b0 < a1 && li.overlaps(&lj) {
                    return Err(format!(
                        "buffers {} (bytes {a0}..{a1}, live {}..={}) and {} (bytes {b0}..{b1}, live {}..={}) overlap while both are live",
                        s.buffers[i].name, li.first, li.last, s.buffers[j].name, lj.first, lj.last
                    ));
                }
            }
        }
        Ok(())
    }
}

/// Whether result `dst` of `op` may be a KV cache.
fn writes_kv(op: &KernelOp, dst: usize) -> bool {
    match op {
        KernelOp::Op(Op::KvStore) => dst == 0,
        KernelOp::RopeKvStore(r) => dst == 0 || (r.v && dst == 1 + r.q as usize),
        _ => false,
    }
}
