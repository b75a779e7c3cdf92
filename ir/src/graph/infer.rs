//! Shape and dtype rules of every op: what the builder uses to type a new node and what the
//! verifier checks each node against. Errors name both shapes involved.

use super::dtype::DType;
use super::op::Op;
use super::shape::{Shape, MAX_DIMS};

/// The type of a source as the rules see it: dtype, shape, and whether it is contiguous.
#[derive(Clone, Copy, Debug)]
pub struct SrcType {
    /// Element type.
    pub dtype: DType,
    /// Shape.
    pub shape: Shape,
    /// Whether its elements lie back to back in `ne` order.
    pub contiguous: bool,
}

fn ts(s: &SrcType) -> String {
    format!("{} {}", s.shape, s.dtype)
}

fn want_f32(what: &str, s: &SrcType) -> Result<(), String> {
    if s.dtype != DType::F32 {
        return Err(format!("{what} must be F32, got {}", ts(s)));
    }
    Ok(())
}

fn want_i32_vec(what: &str, s: &SrcType) -> Result<u64, String> {
    if s.dtype != DType::I32 || s.shape.rank() != 1 || s.shape.has_kv() {
        return Err(format!("{what} must be an I32 vector, got {}", ts(s)));
    }
    Ok(s.shape.ne[0])
}

/// Dtype and shape of the result of `op` on `srcs`, or why the sources do not fit.
pub fn infer(op: &Op, srcs: &[SrcType]) -> Result<(DType, Shape), String> {
    let (lo, hi) = op.arity();
    if srcs.len() < lo || srcs.len() > hi {
        return Err(format!("takes {lo}..={hi} sources, got {}", srcs.len()));
    }
    let a = &srcs[0];
    match op {
        Op::GetRows => {
            let ids = &srcs[1];
            let n = want_i32_vec("ids", ids)?;
            if a.shape.rank() > 2 || a.shape.has_kv() || a.dtype == DType::I32 {
                return Err(format!(
                    "table must be a 2-D float or block matrix, got {}",
                    ts(a)
                ));
            }
            if a.shape.ne[0] % a.dtype.block_size() != 0 {
                return Err(format!("table {} rows are not whole blocks", ts(a)));
            }
            Ok((DType::F32, Shape::new(&[a.shape.ne[0], n])))
        }
        Op::RmsNorm { .. }
        | Op::Norm { .. }
        | Op::Scale { .. }
        | Op::SoftMax { .. }
        | Op::Silu
        | Op::Gelu
        | Op::Tanh
        | Op::SoftCap { .. } => {
            want_f32("x", a)?;
            Ok((DType::F32, a.shape))
        }
        Op::Hadamard { n } => {
            want_f32("x", a)?;
            let n = *n as u64;
            if n < 2 || !n.is_power_of_two() || a.shape.ne[0] % n != 0 {
                return Err(format!(
                    "hadamard n = {n} must be a power of two dividing ne0 of {}",
                    ts(a)
                ));
            }
            Ok((DType::F32, a.shape))
        }
        Op::Add | Op::Mul => {
            let b = &srcs[1];
            want_f32("a", a)?;
            if !b.dtype.is_float() {
                return Err(format!("b must be a float tensor, got {}", ts(b)));
            }
            if !a.shape.can_repeat(&b.shape) {
                return Err(format!("b {} cannot be broadcast onto a {}", ts(b), ts(a)));
            }
            Ok((DType::F32, a.shape))
        }
        Op::Swiglu | Op::Geglu => {
            let b = &srcs[1];
            want_f32("gate", a)?;
            want_f32("up", b)?;
            if a.shape != b.shape {
                return Err(format!("gate {} and up {} differ", ts(a), ts(b)));
            }
            Ok((DType::F32, a.shape))
        }
        Op::MulMat => {
            let b = &srcs[1];
            if a.dtype == DType::I32 || !b.dtype.is_float() {
                return Err(format!("unsupported types: a {} and b {}", ts(a), ts(b)));
            }
            if a.shape.ne[0] != b.shape.ne[0] || a.shape.is_kv(0) != b.shape.is_kv(0) {
                return Err(format!("a {} and b {} differ in ne0", ts(a), ts(b)));
            }
            if a.shape.ne[0] % a.dtype.block_size() != 0 {
                return Err(format!("a {} rows are not whole blocks", ts(a)));
            }
            for d in 2..MAX_DIMS {
                if a.shape.is_kv(d) || b.shape.ne[d] % a.shape.ne[d] != 0 {
                    return Err(format!(
                        "a {} cannot be broadcast over b {} in dim {d}",
                        ts(a),
                        ts(b)
                    ));
                }
            }
            let s = b.shape;
            let mut out = Shape::new(&[a.shape.ne[1], s.ne[1], s.ne[2], s.ne[3]]);
            out.kv = (s.kv & !0b11) | (a.shape.kv >> 1 & 1) | (s.kv & 0b10);
            Ok((DType::F32, out))
        }
        Op::Rope(p) => {
            want_f32("x", a)?;
            let n = want_i32_vec("pos", &srcs[1])?;
            if a.shape.ne[2] != n || a.shape.ne[3] != 1 || a.shape.has_kv() {
                return Err(format!(
                    "x {} does not have pos {} tokens in ne2",
                    ts(a),
                    ts(&srcs[1])
                ));
            }
            if p.n_rot == 0 || p.n_rot % 2 != 0 || p.n_rot as u64 > a.shape.ne[0] {
                return Err(format!(
                    "n_rot {} must be even and ≤ head size of x {}",
                    p.n_rot,
                    ts(a)
                ));
            }
            if let Some(ff) = srcs.get(2) {
                want_f32("freq_factors", ff)?;
                if ff.shape != Shape::new(&[p.n_rot as u64 / 2]) {
                    return Err(format!(
                        "freq_factors {} must be {{n_rot / 2}} = {{{}}}",
                        ts(ff),
                        p.n_rot / 2
                    ));
                }
            }
            Ok((DType::F32, a.shape))
        }
        Op::KvStore => {
            let (cur, pos) = (&srcs[1], &srcs[2]);
            let n = want_i32_vec("pos", pos)?;
            if !a.dtype.is_cache_type()
                || a.shape.rank() > 2
                || a.shape.has_kv()
                || a.shape.ne[0] % a.dtype.block_size() != 0
            {
                return Err(format!(
                    "cache must be a 2-D F32, F16 or Q8_0 matrix of whole blocks, got {}",
                    ts(a)
                ));
            }
            want_f32("cur", cur)?;
            if cur.shape != Shape::new(&[a.shape.ne[0], n]) {
                return Err(format!(
                    "cur {} must be {{{}, {n}}} for cache {} and pos {}",
                    ts(cur),
                    a.shape.ne[0],
                    ts(a),
                    ts(pos)
                ));
            }
            Ok((a.dtype, a.shape))
        }
        Op::Attention(_) => {
            let (k, v, pos) = (&srcs[1], &srcs[2], &srcs[3]);
            want_f32("q", a)?;
            let n = want_i32_vec("pos", pos)?;
            if !(k.dtype.is_float() || k.dtype.is_cache_type())
                || !(v.dtype.is_float() || v.dtype.is_cache_type())
            {
                return Err(format!(
                    "k {} and v {} must be float or a KV cache type",
                    ts(k),
                    ts(v)
                ));
            }
            let (q, ks, vs) = (a.shape, k.shape, v.shape);
            if q.has_kv() || q.ne[2] != n || q.ne[3] != 1 {
                return Err(format!(
                    "q {} must be {{d_k, n_head, n_tokens = {n}}}",
                    ts(a)
                ));
            }
            if ks.ne[0] != q.ne[0] || ks.ne[3] != 1 || ks.kv & 0b1011 != 0 {
                return Err(format!("k {} does not match q {}", ts(k), ts(a)));
            }
            if vs.ne[1] != ks.ne[1] || vs.ne[2] != ks.ne[2] || vs.kv != ks.kv || vs.ne[3] != 1 {
                return Err(format!("v {} does not match k {}", ts(v), ts(k)));
            }
            if ks.ne[1] == 0 || q.ne[1] % ks.ne[1] != 0 {
                return Err(format!(
                    "n_head of q {} is not a multiple of n_head_kv of k {}",
                    ts(a),
                    ts(k)
                ));
            }
            Ok((DType::F32, Shape::new(&[vs.ne[0], q.ne[1], q.ne[2]])))
        }
        Op::Reshape { ne } => {
            if !a.contiguous || a.shape.has_kv() {
                return Err(format!(
                    "source {} must be contiguous, without KV dims",
                    ts(a)
                ));
            }
            let out = Shape { ne: *ne, kv: 0 };
            if out.n_elements() != a.shape.n_elements() {
                return Err(format!(
                    "source {} and target {} differ in size",
                    ts(a),
                    out
                ));
            }
            if ne[0] % a.dtype.block_size() != 0 {
                return Err(format!("target {out} splits blocks of {}", ts(a)));
            }
            Ok((a.dtype, out))
        }
        Op::View { shape, nb, offset } => {
            let bs = a.dtype.block_size();
            if shape.ne[0] % bs != 0 || (bs > 1 && nb[0] != a.dtype.type_size()) {
                return Err(format!("view {shape} splits blocks of {}", ts(a)));
            }
            let bytes = |s: &Shape, nb: &[u64; MAX_DIMS]| -> Option<u64> {
                if s.ne.contains(&0) {
                    return Some(0);
                }
                let mut end = (s.ne[0] / bs - 1)
                    .checked_mul(nb[0])?
                    .checked_add(a.dtype.type_size())?;
                for d in 1..MAX_DIMS {
                    end = end.checked_add((s.ne[d] - 1).checked_mul(nb[d])?)?;
                }
                Some(end)
            };
            let src_bytes = a.dtype.row_size(a.shape.ne[0]).and_then(|r| {
                r.checked_mul(a.shape.ne[1])?
                    .checked_mul(a.shape.ne[2])?
                    .checked_mul(a.shape.ne[3])
            });
            match (
                bytes(shape, nb).and_then(|e| e.checked_add(*offset)),
                src_bytes,
            ) {
                (Some(end), Some(total)) if end <= total => Ok((a.dtype, *shape)),
                _ => Err(format!(
                    "view {shape} nb {nb:?} offset {offset} reaches past source {}",
                    ts(a)
                )),
            }
        }
        Op::Permute { axes } => {
            let mut seen = [false; MAX_DIMS];
            for &x in axes {
                if x as usize >= MAX_DIMS || seen[x as usize] {
                    return Err(format!("axes {axes:?} are not a permutation of 0..4"));
                }
                seen[x as usize] = true;
            }
            if a.dtype.block_size() > 1 && axes[0] != 0 {
                return Err(format!(
                    "permute {axes:?} moves ne0 of block type {}",
                    ts(a)
                ));
            }
            let mut out = Shape::new(&[]);
            for (i, &x) in axes.iter().enumerate() {
                out.ne[x as usize] = a.shape.ne[i];
                if a.shape.is_kv(i) {
                    out.kv |= 1 << x;
                }
            }
            Ok((a.dtype, out))
        }
        Op::TopK { k } => {
            want_f32("x", a)?;
            let k = u64::from(*k);
            if k == 0 || k > a.shape.ne[0] || a.shape.has_kv() {
                return Err(format!(
                    "k = {k} must be in 1..={} of x {}",
                    a.shape.ne[0],
                    ts(a)
                ));
            }
            let mut out = a.shape;
            out.ne[0] = k;
            Ok((DType::I32, out))
        }
        Op::MoeWeights { .. } => {
            let ids = &srcs[1];
            want_f32("probs", a)?;
            let ok = ids.dtype == DType::I32
                && ids.shape.rank() <= 2
                && !ids.shape.has_kv()
                && a.shape.rank() <= 2
                && !a.shape.has_kv()
                && ids.shape.ne[1] == a.shape.ne[1]
                && ids.shape.ne[0] <= a.shape.ne[0];
            if !ok {
                return Err(format!(
                    "probs {} and ids {} must be {{n_expert, T}} and I32 {{k ≤ n_expert, T}}",
                    ts(a),
                    ts(ids)
                ));
            }
            Ok((DType::F32, ids.shape))
        }
        Op::MulMatId => {
            let (b, ids) = (&srcs[1], &srcs[2]);
            let (asz, bs, is) = (a.shape, b.shape, ids.shape);
            if a.dtype == DType::I32 || !a.dtype.is_float() && a.dtype.block_size() == 1 {
                return Err(format!("unsupported expert type {}", ts(a)));
            }
            want_f32("b", b)?;
            if ids.dtype != DType::I32 || is.rank() > 2 || is.has_kv() {
                return Err(format!("ids must be I32 {{k, T}}, got {}", ts(ids)));
            }
            if asz.has_kv() || bs.has_kv() || asz.ne[3] != 1 || bs.ne[3] != 1 {
                return Err(format!("as {} and b {} must be 3-D", ts(a), ts(b)));
            }
            if asz.ne[0] != bs.ne[0] || asz.ne[0] % a.dtype.block_size() != 0 {
                return Err(format!("as {} and b {} differ in ne0", ts(a), ts(b)));
            }
            if bs.ne[2] != is.ne[1] || !(bs.ne[1] == 1 || bs.ne[1] == is.ne[0]) {
                return Err(format!(
                    "b {} must be {{K, 1 or k, T}} for ids {}",
                    ts(b),
                    ts(ids)
                ));
            }
            if is.ne[0] > asz.ne[2] {
                return Err(format!(
                    "ids {} select more than the {} experts",
                    ts(ids),
                    asz.ne[2]
                ));
            }
            Ok((DType::F32, Shape::new(&[asz.ne[1], is.ne[0], is.ne[1]])))
        }
        Op::MoeSum => {
            let w = &srcs[1];
            want_f32("experts", a)?;
            want_f32("weights", w)?;
            let (e, ws) = (a.shape, w.shape);
            if e.has_kv() || ws.has_kv() || e.ne[3] != 1 || ws.rank() > 2 {
                return Err(format!(
                    "experts {} and weights {} must be 3-D and 2-D",
                    ts(a),
                    ts(w)
                ));
            }
            if ws.ne[0] != e.ne[1] || ws.ne[1] != e.ne[2] {
                return Err(format!(
                    "weights {} must be {{k, T}} for experts {}",
                    ts(w),
                    ts(a)
                ));
            }
            Ok((DType::F32, Shape::new(&[e.ne[0], e.ne[2]])))
        }
        Op::Cont => {
            if a.dtype.block_size() > 1 || a.dtype == DType::I32 {
                return Err(format!("cont of {} is not supported", ts(a)));
            }
            Ok((a.dtype, a.shape))
        }
    }
}

/// ggml's contiguous byte strides of a `dtype` tensor of shape `shape` (upper bounds).
pub fn contiguous_nb(dtype: DType, shape: &Shape) -> [u64; MAX_DIMS] {
    let mut nb = [0u64; MAX_DIMS];
    nb[0] = dtype.type_size();
    nb[1] = dtype.row_size(shape.ne[0]).unwrap_or(0);
    for d in 2..MAX_DIMS {
        nb[d] = nb[d - 1].saturating_mul(shape.ne[d - 1]);
    }
    nb
}

/// Whether the result of `op` (with sources `srcs`, result shape `shape`) is contiguous.
pub fn result_contiguous(op: &Op, srcs: &[SrcType], dtype: DType, shape: &Shape) -> bool {
    match op {
        Op::Reshape { .. } => true,
        Op::View { nb, .. } => {
            let want = contiguous_nb(dtype, shape);
            (0..MAX_DIMS).all(|d| shape.ne[d] == 1 || nb[d] == want[d])
        }
        Op::Permute { axes } => {
            srcs[0].contiguous
                && axes
                    .iter()
                    .enumerate()
                    .all(|(i, &x)| i == x as usize || srcs[0].shape.ne[i] == 1)
        }
        _ => true,
    }
}
