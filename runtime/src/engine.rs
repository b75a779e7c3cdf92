//! The execution interface every backend's loaded program implements (the compiled CPU plan,
//! the reference interpreter, later CUDA and Metal): evaluate a ubatch of one sequence's
//! tokens at given positions against that sequence's KV memory and return logits.
//!
//! An engine holds no conversation state: the KV memory and its bookkeeping (which cells
//! hold which positions of which sequence) belong to the runtime's
//! [`Session`](crate::session::Session), which hands the engine the memory of the sequence a
//! call computes ([`KvStream`]). Generation, perplexity and benchmarks are written once over
//! the session.

use ir::plan::KvLayout;

/// The KV memory of one sequence, lent to [`Engine::decode`] for one call.
#[derive(Debug)]
pub struct KvStream<'a> {
    /// Which stream of the session this is (engines that keep their KV state elsewhere, as
    /// the interpreter does, key it by this index).
    pub index: usize,
    /// The stream's bytes, laid out as the engine's [`Engine::kv_layout`] says
    /// ([`KvLayout::stream_bytes`] of them).
    pub mem: &'a mut [u8],
    /// One past the highest cell written so far; the engine raises it to cover every cell
    /// a call writes (padding rows of a padded step included), so that the session clears
    /// exactly what was written when the sequence is truncated.
    pub written: usize,
}

/// What an engine holds besides the KV memory, in bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EngineMemory {
    /// Weight copies the engine made (repacked matrices, small f32 tensors); weights read in
    /// place from the mapped file are not counted.
    pub weights: u64,
    /// Work buffers: the arena of intermediate values and per-thread scratch.
    pub work: u64,
}

/// A loaded program, ready to evaluate tokens (module doc).
pub trait Engine {
    /// Vocabulary size: the length of one row of logits.
    fn n_vocab(&self) -> usize;

    /// Context size of one sequence: its KV memory holds positions `0..n_ctx`.
    fn n_ctx(&self) -> usize;

    /// Largest number of tokens one [`Engine::decode`] call accepts (the ubatch size);
    /// callers split longer inputs.
    fn max_ubatch(&self) -> usize;

    /// Where the caches lie in one sequence's KV memory ([`KvStream::mem`]); a layout of
    /// zero bytes for an engine that keeps its KV state itself.
    fn kv_layout(&self) -> &KvLayout;

    /// Evaluates `tokens` of one sequence at positions `pos0..pos0 + tokens.len()`,
    /// storing their K/V into `kv`, reading the cells `0..pos0` of `kv` as the sequence's
    /// past, and returns logits: `tokens.len()` rows of `n_vocab` values when `all_logits`,
    /// otherwise only the last token's row.
    ///
    /// # Errors
    /// An empty ubatch, more than `max_ubatch` tokens, positions past `n_ctx`, a token id
    /// outside the vocabulary, a `kv` shorter than the layout, or what the backend reports.
    fn decode(
        &mut self,
        kv: &mut KvStream<'_>,
        tokens: &[u32],
        pos0: usize,
        all_logits: bool,
    ) -> anyhow::Result<&[f32]>;

    /// The logits the last successful [`Engine::decode`] returned (empty before any).
    fn last_logits(&self) -> &[f32];

    /// Whether [`Engine::decode_runs`] evaluates runs of several tokens together (else a
    /// caller keeps generated tokens together through [`Engine::decode_seqs`] and gives
    /// prompt chunks their own calls).
    fn mixes_runs(&self) -> bool {
        false
    }

    /// Evaluates a run of tokens of each of several sequences: `runs[i]` continues the
    /// sequence whose KV memory is `kvs[i]` (each stream at most once) at its positions
    /// `pos0..pos0 + tokens.len()`, and the logit row of each run's last token is appended
    /// to `out`, in order. Each row, and each sequence's cache, is what
    /// [`Engine::decode`] of that run alone (`all_logits` false) gives, bit for bit; an
    /// engine with mixed steps evaluates short runs together in one step, prompt chunks and
    /// generated tokens alike (llama-server's continuous batching). The default decodes
    /// them one after another.
    ///
    /// # Errors
    /// Lengths that differ, and what [`Engine::decode`] reports for any run (the cells
    /// written before the error are marked in each stream's `written`).
    fn decode_runs(
        &mut self,
        kvs: &mut [KvStream<'_>],
        runs: &[SeqRun<'_>],
        out: &mut Vec<f32>,
    ) -> anyhow::Result<()> {
        check_runs_args(kvs, runs)?;
        for (kv, run) in kvs.iter_mut().zip(runs) {
            let logits = self.decode(kv, run.tokens, run.pos0, false)?;
            out.extend_from_slice(logits);
        }
        Ok(())
    }

    /// Evaluates one token of each of several sequences: `tokens[i]` at position
    /// `positions[i]` of the sequence whose KV memory is `kvs[i]` (each stream at most
    /// once), appending a logit row per sequence to `out`, in order. Each row is what
    /// [`Engine::decode`] of that token alone returns, bit for bit; an engine with
    /// multi-sequence steps reads each weight once for all of them (llama-server's
    /// continuous batching of the slots' decode tokens). The default decodes them one
    /// after another.
    ///
    /// # Errors
    /// Lengths that differ, and what [`Engine::decode`] reports for any token (the cells
    /// written before the error are marked in each stream's `written`).
    fn decode_seqs(
        &mut self,
        kvs: &mut [KvStream<'_>],
        tokens: &[u32],
        positions: &[usize],
        out: &mut Vec<f32>,
    ) -> anyhow::Result<()> {
        check_seqs_args(kvs, tokens, positions)?;
        for ((kv, &t), &pos) in kvs.iter_mut().zip(tokens).zip(positions) {
            let logits = self.decode(kv, &[t], pos, false)?;
            out.extend_from_slice(logits);
        }
        Ok(())
    }

    /// Evaluates `tokens` of one sequence at positions `pos0..` as [`Engine::decode`] with
    /// `all_logits` does, but with every row computed as that token decoded alone (a
    /// one-token call), appending a logit row per token to `out`: the verification of a
    /// speculative draft, bit for bit what decoding the tokens one at a time gives,
    /// whatever kernels a many-token ubatch would take. An engine with multi-sequence
    /// steps does it in one pass over the weights; the default decodes the tokens one
    /// after another.
    ///
    /// # Errors
    /// As [`Engine::decode`] (the cells written before the error are marked in `written`).
    fn decode_as_singles(
        &mut self,
        kv: &mut KvStream<'_>,
        tokens: &[u32],
        pos0: usize,
        out: &mut Vec<f32>,
    ) -> anyhow::Result<()> {
        for (i, &t) in tokens.iter().enumerate() {
            let logits = self.decode(kv, &[t], pos0 + i, false)?;
            out.extend_from_slice(logits);
        }
        Ok(())
    }

    /// Forgets cells `from..` of stream `stream`, for an engine that keeps KV state outside
    /// the session's memory (the session has already zeroed the cells of its own memory).
    fn forget(&mut self, _stream: usize, _from: usize) {}

    /// Re-ropes the cached keys of cells `from..from + n` of `kv` by `delta` positions
    /// (llama.cpp's K shift, for a context shift); `false` when this engine cannot (the
    /// session then evaluates the moved positions again).
    ///
    /// # Errors
    /// Cells outside the context.
    fn shift_k(
        &mut self,
        _kv: &mut KvStream<'_>,
        _from: usize,
        _n: usize,
        _delta: i64,
    ) -> anyhow::Result<bool> {
        Ok(false)
    }

    /// Memory the engine holds besides the KV memory.
    fn memory(&self) -> EngineMemory;
}

/// The ubatch sizes a [`Engine::decode`] call may cut its tokens into: those of the steps
/// giving a logit row per token (`all_logits`) or one per ubatch, as a loaded program holds
/// them (every backend keeps both lists).
///
/// # Errors
/// A program loaded without steps of the kind asked for; `how` says how to get them.
pub fn step_sizes<'a>(
    all_sizes: &'a [u32],
    last_sizes: &'a [u32],
    all_logits: bool,
    how: &str,
) -> anyhow::Result<&'a [u32]> {
    let sizes = if all_logits { all_sizes } else { last_sizes };
    anyhow::ensure!(
        !sizes.is_empty(),
        "this program was loaded without steps that give {}{how}",
        if all_logits {
            "a logit row per token"
        } else {
            "one logit row per ubatch"
        }
    );
    Ok(sizes)
}

/// Checks the arguments of [`Engine::decode`] the same way for every backend.
///
/// # Errors
/// As [`Engine::decode`] lists them, one line each.
pub fn check_decode_args(engine: &dyn Engine, tokens: &[u32], pos0: usize) -> anyhow::Result<()> {
    anyhow::ensure!(!tokens.is_empty(), "decode: empty ubatch");
    anyhow::ensure!(
        tokens.len() <= engine.max_ubatch(),
        "decode: {} tokens exceed the ubatch size {}",
        tokens.len(),
        engine.max_ubatch()
    );
    let end = pos0 + tokens.len();
    anyhow::ensure!(
        end <= engine.n_ctx(),
        "the context is full: positions up to {end} do not fit in n_ctx = {} (use -c to enlarge it)",
        engine.n_ctx()
    );
    if let Some(&bad) = tokens.iter().find(|&&t| t as usize >= engine.n_vocab()) {
        anyhow::bail!(
            "token id {bad} is outside the vocabulary (n_vocab = {})",
            engine.n_vocab()
        );
    }
    Ok(())
}

/// A run of tokens of one sequence for [`Engine::decode_runs`]: `tokens` at positions
/// `pos0..pos0 + tokens.len()`.
#[derive(Clone, Copy, Debug)]
pub struct SeqRun<'a> {
    /// The tokens (not empty).
    pub tokens: &'a [u32],
    /// The position of the first (the sequence's past is `0..pos0`).
    pub pos0: usize,
}

/// Checks the arguments of [`Engine::decode_runs`]: as many runs as streams.
///
/// # Errors
/// Lengths that differ, one line.
pub fn check_runs_args(kvs: &[KvStream<'_>], runs: &[SeqRun<'_>]) -> anyhow::Result<()> {
    anyhow::ensure!(
        kvs.len() == runs.len(),
        "decode_runs: {} streams and {} runs",
        kvs.len(),
        runs.len()
    );
    Ok(())
}

/// Checks that the arguments of [`Engine::decode_seqs`] have one entry per sequence.
///
/// # Errors
/// As said, in one line.
pub fn check_seqs_args(
    kvs: &[KvStream<'_>],
    tokens: &[u32],
    positions: &[usize],
) -> anyhow::Result<()> {
    anyhow::ensure!(
        kvs.len() == tokens.len() && tokens.len() == positions.len(),
        "decode_seqs: {} streams, {} tokens and {} positions",
        kvs.len(),
        tokens.len(),
        positions.len()
    );
    Ok(())
}

/// A borrowed engine is an engine: a session can borrow one (`Session::single(&mut e)`) and
/// give it back when dropped, for callers that read backend-specific state afterwards (a
/// profile, load statistics).
impl<E: Engine + ?Sized> Engine for &mut E {
    fn n_vocab(&self) -> usize {
        (**self).n_vocab()
    }

    fn n_ctx(&self) -> usize {
        (**self).n_ctx()
    }

    fn max_ubatch(&self) -> usize {
        (**self).max_ubatch()
    }

    fn kv_layout(&self) -> &KvLayout {
        (**self).kv_layout()
    }

    fn decode(
        &mut self,
        kv: &mut KvStream<'_>,
        tokens: &[u32],
        pos0: usize,
        all_logits: bool,
    ) -> anyhow::Result<&[f32]> {
        (**self).decode(kv, tokens, pos0, all_logits)
    }

    fn last_logits(&self) -> &[f32] {
        (**self).last_logits()
    }

    fn mixes_runs(&self) -> bool {
        (**self).mixes_runs()
    }

    fn decode_runs(
        &mut self,
        kvs: &mut [KvStream<'_>],
        runs: &[SeqRun<'_>],
        out: &mut Vec<f32>,
    ) -> anyhow::Result<()> {
        (**self).decode_runs(kvs, runs, out)
    }

    fn decode_seqs(
        &mut self,
        kvs: &mut [KvStream<'_>],
        tokens: &[u32],
        positions: &[usize],
        out: &mut Vec<f32>,
    ) -> anyhow::Result<()> {
        (**self).decode_seqs(kvs, tokens, positions, out)
    }

    fn decode_as_singles(
        &mut self,
        kv: &mut KvStream<'_>,
        tokens: &[u32],
        pos0: usize,
        out: &mut Vec<f32>,
    ) -> anyhow::Result<()> {
        (**self).decode_as_singles(kv, tokens, pos0, out)
    }

    fn forget(&mut self, stream: usize, from: usize) {
        (**self).forget(stream, from)
    }

    fn shift_k(
        &mut self,
        kv: &mut KvStream<'_>,
        from: usize,
        n: usize,
        delta: i64,
    ) -> anyhow::Result<bool> {
        (**self).shift_k(kv, from, n, delta)
    }

    fn memory(&self) -> EngineMemory {
        (**self).memory()
    }
}
