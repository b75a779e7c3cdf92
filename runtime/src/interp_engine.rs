//! The reference interpreter (`ir::interp`) as an [`Engine`]: `modelc run --backend interp`,
//! and the oracle the compiled engine is tested against.

use crate::engine::{check_decode_args, Engine};
use ir::gguf::GgufFile;
use ir::interp::{InterpOptions, Outputs, Session, SessionOptions};

/// An interpreter session over a model lowered by `compiler`.
pub struct InterpEngine<'a> {
    session: Session<'a>,
    n_vocab: usize,
    n_ctx: usize,
    n_ubatch: usize,
    logits: Vec<f32>,
}

impl<'a> InterpEngine<'a> {
    /// An engine for `model` (lowered from `gguf`) with a KV cache of `n_ctx` cells, evaluating
    /// at most `n_ubatch` tokens per graph, with `interp` rounding and threads.
    pub fn new(
        gguf: &'a GgufFile,
        model: &'a compiler::Model,
        n_ctx: usize,
        n_ubatch: usize,
        kv_types: ir::graph::KvTypes,
        interp: InterpOptions,
    ) -> InterpEngine<'a> {
        let opts = SessionOptions {
            n_ctx: n_ctx as u32,
            n_ubatch: n_ubatch as u32,
            kv_types,
            interp,
        };
        InterpEngine {
            session: Session::new(gguf, model, opts),
            n_vocab: model.hparams.n_vocab as usize,
            n_ctx,
            n_ubatch,
            logits: Vec::new(),
        }
    }
}

impl Engine for InterpEngine<'_> {
    fn n_vocab(&self) -> usize {
        self.n_vocab
    }

    fn n_ctx(&self) -> usize {
        self.n_ctx
    }

    fn max_ubatch(&self) -> usize {
        self.n_ubatch
    }

    fn decode(&mut self, tokens: &[u32], pos0: usize, all_logits: bool) -> anyhow::Result<&[f32]> {
        check_decode_args(self, tokens, pos0)?;
        let outputs = if all_logits {
            Outputs::All
        } else {
            Outputs::Last
        };
        let l = self.session.eval(tokens, pos0 as u32, &outputs)?;
        self.logits = l.values;
        Ok(&self.logits)
    }

    fn clear(&mut self) {
        self.session.clear();
    }
}
