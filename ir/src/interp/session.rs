//! A token-level session over the interpreter: builds (and caches) one graph per ubatch shape
//! from a [`GraphSource`], keeps the KV cache across calls, returns logits.
//!
//! ```ignore
//! let gguf = ir::gguf::GgufFile::open(path)?;
//! let model = compiler::load_model(&gguf)?;           // implements GraphSource
//! let mut s = Session::new(&gguf, &model, SessionOptions::default());
//! let logits = s.eval(&prompt, 0, &Outputs::Last)?;    // {n_vocab} for the last token
//! let next = s.eval(&[tok], prompt.len() as u32, &Outputs::Last)?;
//! ```

use super::exec::{Inputs, Interpreter};
use super::weights::WeightSource;
use super::{InterpError, InterpOptions};
use crate::graph::{Graph, KvTypes};
use std::collections::HashMap;

/// The shape of a graph a session asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GraphRequest {
    /// Tokens in the ubatch.
    pub n_tokens: u32,
    /// Rows of the ubatch that produce logits (`inp_out_ids`); may be 0.
    pub n_outputs: u32,
    /// KV cache size in cells (the bound of the symbolic KV length).
    pub n_ctx: u32,
    /// KV cache element types (F16 by default, as llama.cpp).
    pub kv_types: KvTypes,
}

/// Something that lowers a model to a graph for a given ubatch shape (an architecture's
/// lowering, `compiler::Model`).
pub trait GraphSource {
    /// The graph for `req`. Its inputs are [`crate::graph::Input::Tokens`],
    /// `Positions`, `OutputIds` (`n_outputs` rows), weights and KV caches; its first output is
    /// the logits `{n_vocab, n_outputs}`.
    fn build_graph(&self, req: &GraphRequest) -> Result<Graph, String>;
}

/// Settings of a [`Session`].
#[derive(Clone, Copy, Debug)]
pub struct SessionOptions {
    /// KV cache size in cells (positions 0 .. n_ctx).
    pub n_ctx: u32,
    /// Largest ubatch; longer inputs are split (llama.cpp's `n_ubatch`, default 512).
    pub n_ubatch: u32,
    /// KV cache element types (F16 by default, as llama.cpp; `-ctk`, `-ctv`).
    pub kv_types: KvTypes,
    /// Interpreter options.
    pub interp: InterpOptions,
}

impl Default for SessionOptions {
    fn default() -> SessionOptions {
        SessionOptions {
            n_ctx: 2048,
            n_ubatch: 512,
            kv_types: KvTypes::F16,
            interp: InterpOptions::default(),
        }
    }
}

/// Which tokens of an [`Session::eval`] call return logits.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outputs {
    /// Every token.
    All,
    /// The last token only.
    Last,
    /// These token indices (into the call's `tokens`), ascending.
    Rows(Vec<usize>),
    /// None (only fill the KV cache).
    None,
}

/// Logits of the requested tokens.
#[derive(Clone, Debug, PartialEq)]
pub struct Logits {
    /// Vocabulary size (values per row).
    pub n_vocab: usize,
    /// Index (into the call's tokens) of each row.
    pub rows: Vec<usize>,
    /// `rows.len() * n_vocab` values, row after row.
    pub values: Vec<f32>,
}

impl Logits {
    /// The logits of the `i`-th returned row.
    pub fn row(&self, i: usize) -> &[f32] {
        &self.values[i * self.n_vocab..(i + 1) * self.n_vocab]
    }
}

/// A model being run token by token (see the module doc).
pub struct Session<'a> {
    interp: Interpreter<'a>,
    source: &'a dyn GraphSource,
    opts: SessionOptions,
    graphs: HashMap<GraphRequest, Graph>,
}

impl<'a> Session<'a> {
    /// A session with an empty KV cache.
    pub fn new(
        weights: &'a dyn WeightSource,
        source: &'a dyn GraphSource,
        opts: SessionOptions,
    ) -> Session<'a> {
        Session {
            interp: Interpreter::new(weights, opts.interp),
            source,
            opts,
            graphs: HashMap::new(),
        }
    }

    /// The options.
    pub fn options(&self) -> &SessionOptions {
        &self.opts
    }

    /// Empties the KV cache.
    pub fn clear(&mut self) {
        self.interp.state_mut().clear();
    }

    /// The KV cache, to swap in another sequence's or to clear cells of it.
    pub fn kv_state_mut(&mut self) -> &mut super::KvState {
        self.interp.state_mut()
    }

    /// The graph this session runs for `n_tokens` tokens with `n_outputs` logit rows.
    ///
    /// # Errors
    /// [`InterpError::Build`] with the source's message.
    pub fn graph(&mut self, n_tokens: u32, n_outputs: u32) -> Result<&Graph, InterpError> {
        let req = GraphRequest {
            n_tokens,
            n_outputs,
            n_ctx: self.opts.n_ctx,
            kv_types: self.opts.kv_types,
        };
        if !self.graphs.contains_key(&req) {
            let g = self.source.build_graph(&req).map_err(InterpError::Build)?;
            self.graphs.insert(req, g);
        }
        Ok(&self.graphs[&req])
    }

    /// Evaluates `tokens` at positions `pos0, pos0 + 1, ...` (in ubatches of at most
    /// `n_ubatch`), writing their K/V into the cache, and returns the logits of `outputs`.
    /// Earlier cache cells stay visible (causal attention); cells at these positions are
    /// overwritten.
    ///
    /// # Errors
    /// [`InterpError::Input`] if the positions run past `n_ctx`, `tokens` is empty or a row
    /// index is out of range; whatever building or running a graph reports (e.g. a token id
    /// outside the vocabulary, named with the embedding table).
    pub fn eval(
        &mut self,
        tokens: &[u32],
        pos0: u32,
        outputs: &Outputs,
    ) -> Result<Logits, InterpError> {
        let n = tokens.len();
        if n == 0 {
            return Err(InterpError::Input("no tokens to evaluate".into()));
        }
        if pos0 as u64 + n as u64 > self.opts.n_ctx as u64 {
            return Err(InterpError::Input(format!(
                "positions {pos0}..{} do not fit the KV cache of {} cells",
                pos0 as u64 + n as u64,
                self.opts.n_ctx
            )));
        }
        let want: Vec<usize> = match outputs {
            Outputs::All => (0..n).collect(),
            Outputs::Last => vec![n - 1],
            Outputs::None => vec![],
            Outputs::Rows(r) => {
                if r.windows(2).any(|w| w[0] >= w[1]) || r.iter().any(|&i| i >= n) {
                    return Err(InterpError::Input(format!(
                        "output rows {r:?} must be ascending and below {n}"
                    )));
                }
                r.clone()
            }
        };
        let mut logits = Logits {
            n_vocab: 0,
            rows: vec![],
            values: vec![],
        };
        let ub = self.opts.n_ubatch.max(1) as usize;
        for start in (0..n).step_by(ub) {
            let end = (start + ub).min(n);
            let toks: Vec<i32> = tokens[start..end]
                .iter()
                .map(|&t| t.min(i32::MAX as u32) as i32)
                .collect();
            let pos: Vec<i32> = (start..end).map(|i| (pos0 as usize + i) as i32).collect();
            let rows: Vec<usize> = want
                .iter()
                .copied()
                .filter(|&i| i >= start && i < end)
                .collect();
            let out_ids: Vec<i32> = rows.iter().map(|&i| (i - start) as i32).collect();
            let kv_len = pos0 as u64 + end as u64;
            self.graph(toks.len() as u32, out_ids.len() as u32)?;
            let req = GraphRequest {
                n_tokens: toks.len() as u32,
                n_outputs: out_ids.len() as u32,
                n_ctx: self.opts.n_ctx,
                kv_types: self.opts.kv_types,
            };
            let g = &self.graphs[&req];
            let inputs = Inputs {
                tokens: &toks,
                positions: &pos,
                output_ids: &out_ids,
                kv_len,
                data: &[],
            };
            let outs = self.interp.run(g, &inputs)?;
            if !rows.is_empty() {
                let first = outs
                    .into_iter()
                    .next()
                    .ok_or_else(|| InterpError::Build("the graph has no output".into()))?;
                let n_vocab = first.len() / rows.len();
                logits.n_vocab = n_vocab;
                logits.values.extend_from_slice(&first);
                logits.rows.extend(rows);
            }
        }
        Ok(logits)
    }
}
