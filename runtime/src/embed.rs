//! Embeddings as llama.cpp computes them (`llama-embedding`, llama-server's `--embedding`):
//! the model's final hidden state (after the output norm, before the output head:
//! `result_norm`, llama.cpp's `t_embd`) of every token, pooled into one vector per sequence
//! and normalised.
//!
//! - [`Pooling`]: `--pooling none|mean|cls|last|rank`; unspecified, the model's
//!   `{arch}.pooling_type`, else `none` (`llama_context`'s default; decoders carry no key).
//! - [`pool`]: llama.cpp's `build_pooling` on one sequence evaluated in one ubatch: `mean` is
//!   its matrix product of the transposed states with a column of `1 / n_tokens`
//!   (`ggml_vec_dot_f32`'s AVX2 order as `ir::ggml` has it), `cls` the first token's state,
//!   `last` the last one's. `cls` and `last` are llama.cpp's bit for bit wherever the hidden
//!   state is; `mean` differs from llama-server's in the last bit of some values (SmolLM2, 10
//!   tokens: 105 of 576; no summation order tried reproduced it), cosine 1 to 9 digits.
//! - [`normalize`]: `common_embd_normalize` (`--embd-normalize`: -1 none, 0 max-abs scaled to
//!   int16, 2 Euclidean (the default), other p-norms), in f64 with an f32 factor as there.
//! - [`Embedder`]: a session over a plan whose output is the hidden state
//!   (`compiler::GraphOutput::Embeddings`); each call clears the cache and evaluates one
//!   sequence's tokens with a row per token, as `llama-embedding` clears memory before each
//!   batch.

use crate::session::Session;
use crate::tokenizer::TokenId;
use ir::ggml::{vec_dot_avx2_mul_mat, GgmlType};
use ir::gguf::GgufFile;

/// How token states become one embedding (`llama_pooling_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Pooling {
    /// Every token's state (`LLAMA_POOLING_TYPE_NONE`).
    None,
    /// Their mean.
    Mean,
    /// The first token's state.
    Cls,
    /// The last token's state.
    Last,
    /// A classification head's scores (rerankers).
    Rank,
}

impl Pooling {
    /// The value of `--pooling NAME`.
    ///
    /// # Errors
    /// Any other name, in one line listing the valid ones.
    pub fn from_name(name: &str) -> anyhow::Result<Pooling> {
        Ok(match name {
            "none" => Pooling::None,
            "mean" => Pooling::Mean,
            "cls" => Pooling::Cls,
            "last" => Pooling::Last,
            "rank" => Pooling::Rank,
            _ => anyhow::bail!("--pooling {name}: expected none, mean, cls, last or rank"),
        })
    }

    /// The name `--pooling` takes.
    pub fn name(self) -> &'static str {
        match self {
            Pooling::None => "none",
            Pooling::Mean => "mean",
            Pooling::Cls => "cls",
            Pooling::Last => "last",
            Pooling::Rank => "rank",
        }
    }

    /// llama.cpp's number for it (`enum llama_pooling_type`, the GGUF value).
    pub fn from_number(n: u32) -> Option<Pooling> {
        Some(match n {
            0 => Pooling::None,
            1 => Pooling::Mean,
            2 => Pooling::Cls,
            3 => Pooling::Last,
            4 => Pooling::Rank,
            _ => return None,
        })
    }

    /// The model's own pooling, `{arch}.pooling_type` (`None` when absent, as for decoders).
    ///
    /// # Errors
    /// A key of another type or an unknown value.
    pub fn of_model(gguf: &GgufFile) -> anyhow::Result<Option<Pooling>> {
        let md = gguf.metadata();
        let Some(arch) = md.get_str("general.architecture")? else {
            return Ok(None);
        };
        let key = format!("{arch}.pooling_type");
        match md.get_u32(&key)? {
            None => Ok(None),
            Some(n) => Pooling::from_number(n)
                .map(Some)
                .ok_or_else(|| anyhow::anyhow!("{key} = {n}: not a pooling type (0..=4)")),
        }
    }

    /// What llama.cpp's context uses: the one asked for, else the model's, else `none`.
    ///
    /// # Errors
    /// As [`Pooling::of_model`].
    pub fn resolve(requested: Option<Pooling>, gguf: &GgufFile) -> anyhow::Result<Pooling> {
        match requested {
            Some(p) => Ok(p),
            None => Ok(Pooling::of_model(gguf)?.unwrap_or(Pooling::None)),
        }
    }
}

/// `common_embd_normalize`: `inp` scaled by the f32 reciprocal of its norm, computed in f64
/// from f32 products: -1 none, 0 the largest magnitude over 32760 (int16 range), 2 Euclidean,
/// other values the p-norm. An all-zero vector becomes zeros.
pub fn normalize(inp: &[f32], embd_norm: i32) -> Vec<f32> {
    let sum: f64 = match embd_norm {
        -1 => 1.0,
        0 => {
            let mut m = 0.0f64;
            for &x in inp {
                let a = f64::from(x.abs());
                if m < a {
                    m = a;
                }
            }
            m / 32760.0
        }
        2 => {
            let mut s = 0.0f64;
            for &x in inp {
                s += f64::from(x * x);
            }
            s.sqrt()
        }
        p => {
            let mut s = 0.0f64;
            for &x in inp {
                s += f64::from(x.abs()).powf(f64::from(p));
            }
            s.powf(1.0 / f64::from(p))
        }
    };
    let norm = if sum > 0.0 { (1.0 / sum) as f32 } else { 0.0 };
    inp.iter().map(|&x| x * norm).collect()
}

/// `common_embd_similarity_cos`: the cosine of two vectors from f64 sums of f32 products
/// (1 for two zero vectors, 0 for one).
pub fn cosine(a: &[f32], b: &[f32]) -> f32 {
    let (mut s, mut s1, mut s2) = (0.0f64, 0.0f64, 0.0f64);
    for (&x, &y) in a.iter().zip(b) {
        s += f64::from(x * y);
        s1 += f64::from(x * x);
        s2 += f64::from(y * y);
    }
    if s1 == 0.0 || s2 == 0.0 {
        return if s1 == 0.0 && s2 == 0.0 { 1.0 } else { 0.0 };
    }
    (s / (s1.sqrt() * s2.sqrt())) as f32
}

/// The pooled embedding of one sequence whose `states` (`n_tokens` rows of `n_embd`, token
/// order) were computed in one ubatch, as llama.cpp's `build_pooling` computes it. `None`
/// returns the states unchanged (a row per token).
///
/// # Errors
/// Empty or ragged states, and [`Pooling::Rank`] (no classification head here).
pub fn pool(states: &[f32], n_embd: usize, pooling: Pooling) -> anyhow::Result<Vec<f32>> {
    anyhow::ensure!(
        n_embd > 0 && !states.is_empty() && states.len().is_multiple_of(n_embd),
        "pooling: {} values are not rows of {n_embd}",
        states.len()
    );
    let n = states.len() / n_embd;
    Ok(match pooling {
        Pooling::None => states.to_vec(),
        Pooling::Cls => states[..n_embd].to_vec(),
        Pooling::Last => states[(n - 1) * n_embd..].to_vec(),
        Pooling::Mean => {
            // ggml_mul_mat(cont(transpose(states)), inp_mean): row i of the first operand is
            // feature i of every token; one column of 1/n (one sequence: vec_dot_f32).
            let div = 1.0f32 / n as f32;
            let mean: Vec<u8> = std::iter::repeat_n(div.to_le_bytes(), n)
                .flatten()
                .collect();
            let mut row = Vec::with_capacity(4 * n);
            let mut out = Vec::with_capacity(n_embd);
            for i in 0..n_embd {
                row.clear();
                for t in 0..n {
                    row.extend_from_slice(&states[t * n_embd + i].to_le_bytes());
                }
                out.push(vec_dot_avx2_mul_mat(GgmlType::F32, &row, &mean, 1)?);
            }
            out
        }
        Pooling::Rank => anyhow::bail!(
            "--pooling rank needs a reranking model's classification head, which modelc does not lower yet"
        ),
    })
}

/// One dense layer of a classification head: `W {n_in, n_out}` (any type with a dot
/// product) and an optional F32 bias.
struct Dense {
    name: String,
    ty: GgmlType,
    /// The weight's rows, `n_out` of `row_bytes`.
    data: Vec<u8>,
    n_in: usize,
    n_out: usize,
    bias: Option<Vec<f32>>,
}

impl Dense {
    /// `{prefix}.weight` (and `{prefix}.bias`) of `gguf`, or `None` without the weight.
    fn load(gguf: &GgufFile, prefix: &str) -> anyhow::Result<Option<Dense>> {
        let name = format!("{prefix}.weight");
        let Some(t) = gguf.tensor(&name) else {
            return Ok(None);
        };
        let (n_in, n_out) = (t.ne[0] as usize, t.ne[1] as usize);
        anyhow::ensure!(
            t.ne[2] <= 1 && t.ne[3] <= 1 && n_in > 0 && n_out > 0,
            "{name}: expected a matrix, found {:?}",
            t.ne
        );
        anyhow::ensure!(
            ir::ggml::vec_dot_type(t.ggml_type).is_some(),
            "{name}: no dot product for {}",
            t.ggml_type
        );
        let data = gguf.tensor_data(t).to_vec();
        let bias = match gguf.tensor(&format!("{prefix}.bias")) {
            None => None,
            Some(b) => {
                anyhow::ensure!(
                    b.ggml_type == GgmlType::F32 && b.ne[0] as usize == n_out,
                    "{prefix}.bias: expected F32 of {n_out} values"
                );
                Some(
                    gguf.tensor_data(b)
                        .chunks_exact(4)
                        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                        .collect(),
                )
            }
        };
        Ok(Some(Dense {
            name,
            ty: t.ggml_type,
            data,
            n_in,
            n_out,
            bias,
        }))
    }

    /// `W · x + b` as ggml-cpu's `mul_mat` of one column (the activation converted to the
    /// weight's dot type, llama.cpp's AVX2 order), then `ggml_add`.
    fn apply(&self, x: &[f32]) -> anyhow::Result<Vec<f32>> {
        anyhow::ensure!(
            x.len() == self.n_in,
            "{}: {} inputs for a weight of {}",
            self.name,
            x.len(),
            self.n_in
        );
        let (_, act) = ir::ggml::quantize_activations(self.ty, x, ir::ggml::Q8Flavor::X86)?;
        let row = self.data.len() / self.n_out;
        let mut out = Vec::with_capacity(self.n_out);
        for (i, w) in self.data.chunks_exact(row).enumerate() {
            let mut v = vec_dot_avx2_mul_mat(self.ty, w, &act, 1)?;
            if let Some(b) = &self.bias {
                v += b[i];
            }
            out.push(v);
        }
        Ok(out)
    }
}

/// A reranker's classification head (llama.cpp's `build_pooling` for
/// `LLAMA_POOLING_TYPE_RANK` on bert): the first token's state through `cls` (+ bias) and
/// `tanh` when the model has `cls.weight`, then `cls.output` (+ bias) when it has
/// `cls.output.weight`: `n_cls_out` scores (one for a reranker, its relevance score).
pub struct ClsHead {
    cls: Option<Dense>,
    out: Option<Dense>,
}

impl ClsHead {
    /// The head of `gguf` (`cls.weight`, `cls.bias`, `cls.output.weight`,
    /// `cls.output.bias`, each optional as in llama.cpp).
    ///
    /// # Errors
    /// A head tensor of the wrong shape or type.
    pub fn from_gguf(gguf: &GgufFile) -> anyhow::Result<ClsHead> {
        Ok(ClsHead {
            cls: Dense::load(gguf, "cls")?,
            out: Dense::load(gguf, "cls.output")?,
        })
    }

    /// The scores of one sequence whose first token's state is `cls_state`.
    ///
    /// # Errors
    /// A state of another width than the head takes.
    pub fn scores(&self, cls_state: &[f32]) -> anyhow::Result<Vec<f32>> {
        let mut cur = cls_state.to_vec();
        if let Some(c) = &self.cls {
            // ggml_tanh on the CPU: tanhf per value.
            cur = c.apply(&cur)?.into_iter().map(f32::tanh).collect();
        }
        if let Some(o) = &self.out {
            cur = o.apply(&cur)?;
        }
        Ok(cur)
    }
}

/// A session over a model compiled to output its hidden state (module doc).
pub struct Embedder<'a> {
    session: Session<'a>,
    pooling: Pooling,
    n_ubatch: usize,
    head: Option<ClsHead>,
}

impl<'a> Embedder<'a> {
    /// Wraps `session`, whose engine returns hidden states (a plan of
    /// `compiler::GraphOutput::Embeddings`), pooling with `pooling`.
    ///
    /// # Errors
    /// [`Pooling::Rank`], which needs a classification head.
    pub fn new(session: Session<'a>, pooling: Pooling) -> anyhow::Result<Embedder<'a>> {
        if pooling == Pooling::Rank {
            pool(&[0.0], 1, pooling)?;
        }
        let n_ubatch = session.max_ubatch();
        Ok(Embedder {
            session,
            pooling,
            n_ubatch,
            head: None,
        })
    }

    /// [`Embedder::reranker`] for [`Pooling::Rank`], else [`Embedder::new`].
    ///
    /// # Errors
    /// As those.
    pub fn open(
        session: Session<'a>,
        pooling: Pooling,
        gguf: &GgufFile,
    ) -> anyhow::Result<Embedder<'a>> {
        if pooling == Pooling::Rank {
            Embedder::reranker(session, gguf)
        } else {
            Embedder::new(session, pooling)
        }
    }

    /// An embedder with [`Pooling::Rank`]: each sequence's first token's state through the
    /// classification head of `gguf` ([`ClsHead`]), the scores as its one row.
    ///
    /// # Errors
    /// A model without a head (neither `cls.weight` nor `cls.output.weight`), or a bad one.
    pub fn reranker(session: Session<'a>, gguf: &GgufFile) -> anyhow::Result<Embedder<'a>> {
        let head = ClsHead::from_gguf(gguf)?;
        anyhow::ensure!(
            head.cls.is_some() || head.out.is_some(),
            "--pooling rank: the model has no classification head (cls.weight / cls.output.weight)"
        );
        let n_ubatch = session.max_ubatch();
        Ok(Embedder {
            session,
            pooling: Pooling::Rank,
            n_ubatch,
            head: Some(head),
        })
    }

    /// The physical batch llama.cpp would have (`-ub`): an input of more tokens needs several
    /// ubatches, which only `last` pooling allows (llama-server's `can_split`).
    pub fn n_ubatch(&self) -> usize {
        self.n_ubatch
    }

    /// Sets [`Embedder::n_ubatch`] (`-ub`; at least 1).
    pub fn set_n_ubatch(&mut self, n: usize) {
        self.n_ubatch = n.max(1);
    }

    /// The pooling.
    pub fn pooling(&self) -> Pooling {
        self.pooling
    }

    /// Tokens one sequence may hold (the context).
    pub fn n_ctx(&self) -> usize {
        self.session.n_ctx()
    }

    /// The embeddings of one sequence, not normalised: a row per token with
    /// [`Pooling::None`], else one.
    ///
    /// # Errors
    /// No tokens, more than the context holds, a token outside the vocabulary, or what the
    /// engine reports.
    pub fn embed(&mut self, tokens: &[TokenId]) -> anyhow::Result<Vec<Vec<f32>>> {
        anyhow::ensure!(!tokens.is_empty(), "Input content cannot be empty");
        anyhow::ensure!(
            tokens.len() <= self.session.n_ctx(),
            "the input is {} tokens, longer than the context ({}): use -c to enlarge it",
            tokens.len(),
            self.session.n_ctx()
        );
        self.session.clear();
        let mut states = Vec::new();
        for part in tokens.chunks(self.session.max_ubatch().max(1)) {
            states.extend_from_slice(self.session.eval(0, part, true)?);
        }
        let n_embd = states.len() / tokens.len();
        if let Some(head) = &self.head {
            return Ok(vec![head.scores(&states[..n_embd])?]);
        }
        let pooled = pool(&states, n_embd, self.pooling)?;
        Ok(pooled.chunks(n_embd).map(<[f32]>::to_vec).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn euclidean_norm_is_one_and_zero_stays_zero() {
        let v = normalize(&[3.0, 4.0], 2);
        assert_eq!(v, vec![0.6, 0.8]);
        assert_eq!(normalize(&[0.0, 0.0], 2), vec![0.0, 0.0]);
        assert_eq!(normalize(&[1.0, -2.0], -1), vec![1.0, -2.0]);
        // Max-abs: the largest magnitude maps to 32760.
        assert_eq!(normalize(&[0.5, -1.0], 0), vec![16380.0, -32760.0]);
        // Taxicab.
        assert_eq!(normalize(&[1.0, -3.0], 1), vec![0.25, -0.75]);
    }

    #[test]
    fn pooling_picks_rows_and_averages() {
        let s = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
        assert_eq!(pool(&s, 2, Pooling::Cls).unwrap(), vec![1.0, 2.0]);
        assert_eq!(pool(&s, 2, Pooling::Last).unwrap(), vec![5.0, 6.0]);
        assert_eq!(pool(&s, 2, Pooling::None).unwrap(), s.to_vec());
        let m = pool(&s, 2, Pooling::Mean).unwrap();
        assert!((m[0] - 3.0).abs() < 1e-6 && (m[1] - 4.0).abs() < 1e-6);
        assert!(pool(&s, 4, Pooling::Mean).is_err());
        assert!(pool(&s, 2, Pooling::Rank).is_err());
    }

    #[test]
    fn pooling_names_round_trip() {
        for p in [
            Pooling::None,
            Pooling::Mean,
            Pooling::Cls,
            Pooling::Last,
            Pooling::Rank,
        ] {
            assert_eq!(Pooling::from_name(p.name()).unwrap(), p);
        }
        assert!(Pooling::from_name("max").is_err());
        assert_eq!(Pooling::from_number(3), Some(Pooling::Last));
        assert_eq!(Pooling::from_number(9), None);
    }

    #[test]
    fn cosine_of_parallel_and_orthogonal() {
        assert_eq!(cosine(&[1.0, 0.0], &[2.0, 0.0]), 1.0);
        assert_eq!(cosine(&[1.0, 0.0], &[0.0, 1.0]), 0.0);
        assert_eq!(cosine(&[0.0, 0.0], &[0.0, 0.0]), 1.0);
        assert_eq!(cosine(&[0.0, 0.0], &[1.0, 0.0]), 0.0);
    }
}
