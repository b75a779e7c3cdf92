//! The fusion passes. Each finds one pattern in a step's kernel list and replaces the
//! kernels that match by one fused kernel ([`ir::plan::KernelOp`]) whose expansion is the same
//! IR ops in the same order, so the plan's results do not change (bit for bit).
//!
//! A match is only applied where moving the work to one place is safe ([`rewrite::replace_group`]:
//! no one else reads what disappears, results are ready for their readers, nothing in
//! between touches what the group writes). They run in this order, each building on the last:
//!
//! 1. `fuse-rms-norm-mul`: `rms_norm(x)`, then `mul(·, w)` with a weight vector `w` and no
//!    other reader → `rms_norm+mul` (llama.cpp's `build_norm`).
//! 2. `fuse-siblings`: bare `mul_mat`s of weights with the same input → one `mul_mat×n`
//!    (q/k/v of attention, gate/up of the FFN; up to 4).
//! 3. `fuse-norm-mul-mat`: an `rms_norm+mul` read only by bare products → the products'
//!    prologue (`attn_norm` into q/k/v, `ffn_norm` into gate/up, `output_norm` into the
//!    output projection). With several reading kernels each recomputes the norm (a row
//!    reduction, cheap next to the product).
//! 4. `fuse-glu`: `mul_mat×2` whose two results feed only a `swiglu` / `geglu` → the GLU as
//!    the product's epilogue.
//! 5. `fuse-residual-add`: a one-weight product whose result feeds only an `add` → the add as
//!    its epilogue (the residual add after `attn_output` and `ffn_down`; also a bias).
//! 6. `fuse-rope-kv-store`: `rope` of K feeding only a `kv_store` → `rope+kv_store`, taking in
//!    the rope of Q (same positions and parameters, Q made by the same kernel as K) and the
//!    store of V of the same layer when they can join.

pub mod rewrite;

use ir::graph::KvKind;
use ir::graph::Op;
use ir::plan::{
    Base, Epilogue, Kernel, KernelOp, KvBuf, MulMatSpec, RopeKvStoreSpec, Step, ValueId,
};
use rewrite::{nodes_of, rewrite_all, same, Mm, Uses};

/// Pass `fuse-rms-norm-mul` (see the module doc).
pub fn fuse_rms_norm_mul(step: &mut Step, _kv: &[KvBuf]) {
    rewrite_all(step, |s, u, k| {
        let norm = &s.kernels[k];
        let KernelOp::Op(Op::RmsNorm { eps }) = norm.op else {
            return vec![];
        };
        let d = norm.dsts[0];
        let dv = s.value(d);
        let (false, [j]) = (u.is_output(dv.base), u.readers(dv.base)) else {
            return vec![];
        };
        let mul = &s.kernels[*j];
        if mul.op != KernelOp::Op(Op::Mul)
            || !same(s, mul.srcs[0], d)
            || s.value(mul.srcs[1]).base == dv.base
        {
            return vec![];
        }
        if !rewrite::is_vector(s.value(mul.srcs[1]), dv.shape.ne[0]) {
            return vec![];
        }
        let new = Kernel {
            name: mul.name.clone(),
            op: KernelOp::RmsNormMul { eps },
            srcs: vec![norm.srcs[0], mul.srcs[1]],
            dsts: mul.dsts.clone(),
            nodes: nodes_of([norm, mul]),
            target: None,
        };
        vec![(vec![k, *j], new)]
    });
}

/// Pass `fuse-siblings` (see the module doc).
pub fn fuse_siblings(step: &mut Step, _kv: &[KvBuf]) {
    rewrite_all(step, |s, _u, k| {
        let Some(first) = Mm::of(s, &s.kernels[k]).filter(|m| m.is_plain() && m.ws.len() == 1)
        else {
            return vec![];
        };
        let mut group = vec![k];
        let mut mms = vec![first.clone()];
        for j in k + 1..s.kernels.len() {
            if group.len() == 4 {
                break;
            }
            if let Some(m) = Mm::of(s, &s.kernels[j]).filter(|m| m.is_plain() && m.ws.len() == 1) {
                if same(s, m.x, first.x) {
                    group.push(j);
                    mms.push(m);
                }
            }
        }
        if group.len() < 2 {
            return vec![];
        }
        let mut out = Vec::new();
        // Try the largest group first, then shorter prefixes (a later sibling may not be
        // movable).
        for n in (2..=group.len()).rev() {
            let members: Vec<&Kernel> = group[..n].iter().map(|&i| &s.kernels[i]).collect();
            let mut srcs = vec![first.x];
            srcs.extend(mms[..n].iter().map(|m| m.ws[0]));
            let new = Kernel {
                name: members
                    .iter()
                    .map(|m| m.name.as_str())
                    .collect::<Vec<_>>()
                    .join(","),
                op: KernelOp::MulMat(MulMatSpec {
                    norm: None,
                    n_mat: n as u8,
                    epilogue: Epilogue::None,
                }),
                srcs,
                dsts: members.iter().map(|m| m.dsts[0]).collect(),
                nodes: nodes_of(members.iter().copied()),
                target: None,
            };
            out.push((group[..n].to_vec(), new));
        }
        out
    });
}

/// Pass `fuse-norm-mul-mat` (see the module doc).
pub fn fuse_norm_mul_mat(step: &mut Step, _kv: &[KvBuf]) {
    let mut u = Uses::of(step);
    let mut k = 0;
    while k < step.kernels.len() {
        if try_norm_into_readers(step, &u, k) {
            u = Uses::of(step);
        } else {
            k += 1;
        }
    }
    rewrite::compact(step);
}

fn try_norm_into_readers(step: &mut Step, u: &Uses, k: usize) -> bool {
    let norm = &step.kernels[k];
    let KernelOp::RmsNormMul { eps } = norm.op else {
        return false;
    };
    let (x, w, d) = (norm.srcs[0], norm.srcs[1], norm.dsts[0]);
    let dl = step.value(d).base;
    // The norm's input and weight must stay as they are until every reader ran: written
    // by no one after the norm (KV caches are updated in place: not taken).
    for v in [x, w] {
        let l = step.value(v).base;
        if matches!(l, Base::Kv(_)) || u.writers(l).iter().any(|&wk| wk > k) {
            return false;
        }
    }
    let readers = u.readers(dl);
    if u.is_output(dl) || readers.is_empty() {
        return false;
    }
    let mut rewritten = Vec::new();
    for &r in readers {
        let Some(m) = Mm::of(step, &step.kernels[r]) else {
            return false;
        };
        let uses_d_elsewhere = m.ws.iter().chain(&m.r).any(|v| step.value(*v).base == dl);
        if m.spec.norm.is_some() || !same(step, m.x, d) || uses_d_elsewhere {
            return false;
        }
        let fused = Mm {
            spec: MulMatSpec {
                norm: Some(eps),
                ..m.spec
            },
            x,
            norm_w: Some(w),
            ..m
        };
        let (op, srcs) = fused.op_and_srcs();
        let kr = &step.kernels[r];
        let mut nodes = norm.nodes.clone();
        nodes.extend(kr.nodes.iter().cloned());
        rewritten.push((
            r,
            Kernel {
                name: kr.name.clone(),
                op,
                srcs,
                dsts: kr.dsts.clone(),
                nodes,
                target: None,
            },
        ));
    }
    for (r, kn) in rewritten {
        step.kernels[r] = kn;
    }
    step.kernels.remove(k);
    true
}

/// Pass `fuse-glu` (see the module doc).
pub fn fuse_glu(step: &mut Step, _kv: &[KvBuf]) {
    rewrite_all(step, |s, u, j| {
        let glu = &s.kernels[j];
        let epilogue = match glu.op {
            KernelOp::Op(Op::Swiglu) => Epilogue::Swiglu,
            KernelOp::Op(Op::Geglu) => Epilogue::Geglu,
            _ => return vec![],
        };
        let (g, up) = (glu.srcs[0], glu.srcs[1]);
        let Some(i) = u.producer(s.value(g).base) else {
            return vec![];
        };
        let Some(m) = Mm::of(s, &s.kernels[i]) else {
            return vec![];
        };
        if m.spec.epilogue != Epilogue::None || m.ws.len() != 2 {
            return vec![];
        }
        let d = &s.kernels[i].dsts;
        let ws = if same(s, d[0], g) && same(s, d[1], up) {
            vec![m.ws[0], m.ws[1]]
        } else if same(s, d[1], g) && same(s, d[0], up) {
            vec![m.ws[1], m.ws[0]]
        } else {
            return vec![];
        };
        let fused = Mm {
            spec: MulMatSpec { epilogue, ..m.spec },
            ws,
            ..m
        };
        let (op, srcs) = fused.op_and_srcs();
        let new = Kernel {
            name: glu.name.clone(),
            op,
            srcs,
            dsts: glu.dsts.clone(),
            nodes: nodes_of([&s.kernels[i], glu]),
            target: None,
        };
        vec![(vec![i, j], new)]
    });
}

/// Pass `fuse-residual-add` (see the module doc).
pub fn fuse_residual_add(step: &mut Step, _kv: &[KvBuf]) {
    rewrite_all(step, |s, u, j| {
        let add = &s.kernels[j];
        if add.op != KernelOp::Op(Op::Add) {
            return vec![];
        }
        let mut out = Vec::new();
        for (p, r, second) in [
            (add.srcs[0], add.srcs[1], false),
            (add.srcs[1], add.srcs[0], true),
        ] {
            let (pv, rv) = (s.value(p), s.value(r));
            // add(r, p) with p second equals add(p, r) only without broadcasting.
            if pv.base == rv.base || (second && pv.shape != rv.shape) {
                continue;
            }
            let Some(i) = u.producer(pv.base) else {
                continue;
            };
            let Some(m) = Mm::of(s, &s.kernels[i]) else {
                continue;
            };
            if m.spec.epilogue != Epilogue::None
                || m.ws.len() != 1
                || !same(s, s.kernels[i].dsts[0], p)
            {
                continue;
            }
            let fused = Mm {
                spec: MulMatSpec {
                    epilogue: Epilogue::Add,
                    ..m.spec
                },
                r: Some(r),
                ..m
            };
            let (op, srcs) = fused.op_and_srcs();
            let new = Kernel {
                name: add.name.clone(),
                op,
                srcs,
                dsts: add.dsts.clone(),
                nodes: nodes_of([&s.kernels[i], add]),
                target: None,
            };
            out.push((vec![i, j], new));
        }
        out
    });
}

/// Pass `fuse-rope-kv-store` (see the module doc).
pub fn fuse_rope_kv_store(step: &mut Step, kv: &[KvBuf]) {
    rewrite_all(step, |s, u, k| {
        let store = &s.kernels[k];
        if store.op != KernelOp::Op(Op::KvStore) {
            return vec![];
        }
        let (cache, cur, pos) = (store.srcs[0], store.srcs[1], store.srcs[2]);
        let Base::Kv(kc) = s.value(cache).base else {
            return vec![];
        };
        let Some(kcache) = kv.get(kc.index()).filter(|c| c.kind == KvKind::K) else {
            return vec![];
        };
        // The rope whose result the store writes, seen as {n_embd_gqa, n_tokens}.
        let curv = s.value(cur);
        let Some(r) = u.producer(curv.base) else {
            return vec![];
        };
        let rope = &s.kernels[r];
        let KernelOp::Op(Op::Rope(params)) = rope.op else {
            return vec![];
        };
        let rv = s.value(rope.dsts[0]);
        if !(curv.is_contiguous()
            && rv.is_contiguous()
            && curv.offset == rv.offset
            && curv.shape.n_elements() == rv.shape.n_elements())
        {
            return vec![];
        }
        if !same(s, rope.srcs[1], pos) {
            return vec![];
        }
        let ff = rope.srcs.get(2).copied();
        let k_src = rope.srcs[0];
        // Rope of Q: same parameters, positions and factors, and either the rope whose
        // result the attention over this K cache reads, or one whose Q was made by the
        // kernel that made K (q/k/v as siblings).
        let is_q_rope = |i: usize| {
            let q = &s.kernels[i];
            i != r
                && q.op == rope.op
                && same(s, q.srcs[1], pos)
                && q.srcs.get(2).map(|f| s.value(*f)) == ff.map(|f| s.value(f))
                && u.readers(s.value(q.dsts[0]).base)
                    .iter()
                    .all(|&x| s.kernels[x].op != KernelOp::Op(Op::KvStore))
        };
        let via_attention = u
            .readers(Base::Kv(kc))
            .iter()
            .find_map(|&a| match s.kernels[a].op {
                KernelOp::Op(Op::Attention(_)) => u.producer(s.value(s.kernels[a].srcs[0]).base),
                _ => None,
            });
        let k_maker = u.producer(s.value(k_src).base);
        let via_maker = (0..s.kernels.len()).find(|&i| {
            k_maker.is_some()
                && u.producer(s.value(s.kernels[i].srcs[0]).base) == k_maker
                && is_q_rope(i)
        });
        let q = via_attention.filter(|&i| is_q_rope(i)).or(via_maker);
        // Store of V: same positions, the V cache of the same layer.
        let v = (0..s.kernels.len()).find(|&i| {
            let st = &s.kernels[i];
            st.op == KernelOp::Op(Op::KvStore)
                && same(s, st.srcs[2], pos)
                && matches!(s.value(st.srcs[0]).base, Base::Kv(c) if kv.get(c.index()).is_some_and(|c| c.kind == KvKind::V && c.layer == kcache.layer))
        });
        let mut out = Vec::new();
        for (with_q, with_v) in [(true, true), (true, false), (false, true), (false, false)] {
            let (q, v) = (q.filter(|_| with_q), v.filter(|_| with_v));
            if (with_q && q.is_none()) || (with_v && v.is_none()) {
                continue;
            }
            let mut srcs: Vec<ValueId> = vec![k_src, pos];
            srcs.extend(ff);
            let mut dsts = vec![store.dsts[0]];
            let mut group = vec![r, k];
            if let Some(q) = q {
                srcs.push(s.kernels[q].srcs[0]);
                dsts.push(s.kernels[q].dsts[0]);
                group.push(q);
            }
            if let Some(v) = v {
                srcs.push(s.kernels[v].srcs[1]);
                dsts.push(s.kernels[v].dsts[0]);
                group.push(v);
            }
            group.sort_unstable();
            let new = Kernel {
                name: store.name.clone(),
                op: KernelOp::RopeKvStore(RopeKvStoreSpec {
                    rope: params,
                    freq_factors: ff.is_some(),
                    q: q.is_some(),
                    v: v.is_some(),
                }),
                srcs,
                dsts,
                nodes: nodes_of(group.iter().map(|&i| &s.kernels[i])),
                target: None,
            };
            out.push((group, new));
        }
        out
    });
}
