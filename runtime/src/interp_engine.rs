//! The reference interpreter (`ir::interp`) as an [`Engine`]: `modelc run --backend interp`,
//! and the oracle the compiled engine is tested against.
//!
//! The interpreter keeps its KV caches as f32 values of its own ([`ir::interp::KvState`]), not
//! in the session's memory: this engine keeps one state per session stream, swapped in for
//! each call, and forgets cells when the session truncates a sequence ([`Engine::forget`]).

use crate::engine::{check_decode_args, Engine, EngineMemory, KvStream};
use ir::gguf::GgufFile;
use ir::interp::{InterpOptions, KvState, Outputs, Session, SessionOptions};
use ir::plan::KvLayout;

/// An interpreter session over a model lowered by `compiler`.
pub struct InterpEngine<'a> {
    session: Session<'a>,
    n_vocab: usize,
    n_ctx: usize,
    n_ubatch: usize,
    logits: Vec<f32>,
    /// A layout of no bytes: the KV state is the interpreter's.
    layout: KvLayout,
    /// The KV state of each stream but the one inside the interpreter.
    states: Vec<KvState>,
    /// Which stream's state is inside the interpreter.
    current: usize,
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
        mut interp: InterpOptions,
    ) -> InterpEngine<'a> {
        // Rings (InterpOptions::kv_ring_ubatch) hold a window and a whole graph's tokens.
        interp.kv_ring_ubatch = interp.kv_ring_ubatch.map(|ub| ub.max(n_ubatch as u32));
        // The interpreter keeps its own caches: the layout has no bytes, only the cells of
        // each cache, so that the session knows which positions a ring still holds.
        let hp = &model.hparams;
        let caches = (0..hp.n_layer)
            .flat_map(|il| {
                let window = hp.is_swa(il).then_some(hp.n_swa);
                let n_cells = match (window, interp.kv_ring_ubatch) {
                    (Some(w), Some(ub)) => ir::plan::swa_cells(n_ctx as u64, w, ub),
                    _ => n_ctx as u64,
                };
                let slot = ir::plan::KvSlot {
                    offset: 0,
                    row_bytes: 0,
                    n_cells,
                    window,
                };
                [slot, slot]
            })
            .collect();
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
            layout: KvLayout {
                n_cells: n_ctx as u64,
                caches,
                stream_bytes: 0,
            },
            states: Vec::new(),
            current: 0,
        }
    }

    /// Puts stream `i`'s KV state inside the interpreter.
    fn switch_to(&mut self, i: usize) {
        if i == self.current {
            return;
        }
        let need = i.max(self.current) + 1;
        if self.states.len() < need {
            self.states.resize_with(need, KvState::default);
        }
        std::mem::swap(self.session.kv_state_mut(), &mut self.states[self.current]);
        std::mem::swap(self.session.kv_state_mut(), &mut self.states[i]);
        self.current = i;
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

    fn kv_layout(&self) -> &KvLayout {
        &self.layout
    }

    fn last_logits(&self) -> &[f32] {
        &self.logits
    }

    fn memory(&self) -> EngineMemory {
        EngineMemory::default()
    }

    fn decode(
        &mut self,
        kv: &mut KvStream<'_>,
        tokens: &[u32],
        pos0: usize,
        all_logits: bool,
    ) -> anyhow::Result<&[f32]> {
        check_decode_args(self, tokens, pos0)?;
        self.switch_to(kv.index);
        let outputs = if all_logits {
            Outputs::All
        } else {
            Outputs::Last
        };
        let l = self.session.eval(tokens, pos0 as u32, &outputs)?;
        kv.written = kv.written.max(pos0 + tokens.len());
        self.logits = l.values;
        Ok(&self.logits)
    }

    fn forget(&mut self, stream: usize, from: usize) {
        if stream == self.current {
            self.session.kv_state_mut().clear_cells(from);
        } else if let Some(s) = self.states.get_mut(stream) {
            s.clear_cells(from);
        }
    }
}
