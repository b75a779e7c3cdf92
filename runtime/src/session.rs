//! A session: one loaded [`Engine`] with the KV memory of one or more sequences, and the
//! calls that evaluate, continue, truncate and clear them. What the REPL, the runner, the
//! server and the tests drive.
//!
//! A sequence continues where it stopped: [`Session::eval`] appends tokens at its `n_past`;
//! [`Session::truncate`] drops its positions from `n` on (`/regen`, a stop string, a prompt
//! that shares only a prefix with what the cache holds), zeroing those cells so that what
//! follows computes exactly as on a fresh cache. [`Session::decode_batch`] takes tokens of
//! several sequences in one call, each with its sequence id as `llama_batch` has them, and
//! evaluates each run of one sequence's tokens against that sequence's memory (module doc
//! of [`crate::kv_cache`]): every sequence computes what it would alone.

use crate::engine::{Engine, EngineMemory, SeqRun};
use crate::kv_cache::{KvCache, SeqId};
use crate::tokenizer::TokenId;

/// One token of a [`Session::decode_batch`] call (an entry of `llama_batch`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchToken {
    /// The token.
    pub token: TokenId,
    /// The sequence it continues (its position is that sequence's next one).
    pub seq: SeqId,
    /// Whether its logits are returned.
    pub logits: bool,
}

/// What a session holds, in bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryReport {
    /// KV memory of all sequences (allocated; pages are mapped as cells are written).
    pub kv: u64,
    /// KV memory of one sequence.
    pub kv_per_seq: u64,
    /// Cells written, all sequences together.
    pub kv_cells_written: u64,
    /// What the engine holds besides the KV memory.
    pub engine: EngineMemory,
}

/// A loaded engine with its sequences' KV memory (module doc).
pub struct Session<'w> {
    engine: Box<dyn Engine + 'w>,
    kv: KvCache,
    /// Logit rows of the last engine call of [`Session::decode_batch_into`] where they
    /// must be reordered: kept between calls, so that a step's megabytes of rows land in
    /// memory already mapped, not in pages the kernel must fault in and zero each step.
    rows: Vec<f32>,
}

impl<'w> Session<'w> {
    /// A session over `engine` with room for `n_seq_max` sequences of the engine's context.
    ///
    /// # Errors
    /// `n_seq_max` of 0, or KV memory that cannot be allocated (one line naming the size and
    /// the memory available).
    pub fn new(engine: Box<dyn Engine + 'w>, n_seq_max: usize) -> anyhow::Result<Session<'w>> {
        let kv = KvCache::new(engine.kv_layout().clone(), n_seq_max)?;
        Ok(Session {
            engine,
            kv,
            rows: Vec::new(),
        })
    }

    /// A session with one sequence (id 0), as the runner and `modelc run` use.
    ///
    /// # Errors
    /// As [`Session::new`].
    pub fn single(engine: impl Engine + 'w) -> anyhow::Result<Session<'w>> {
        Session::new(Box::new(engine), 1)
    }

    /// The engine.
    pub fn engine(&self) -> &dyn Engine {
        self.engine.as_ref()
    }

    /// The engine, mutably.
    pub fn engine_mut(&mut self) -> &mut dyn Engine {
        self.engine.as_mut()
    }

    /// Vocabulary size.
    pub fn n_vocab(&self) -> usize {
        self.engine.n_vocab()
    }

    /// Context size of each sequence.
    pub fn n_ctx(&self) -> usize {
        self.engine.n_ctx()
    }

    /// Most tokens of one sequence evaluated per engine call.
    pub fn max_ubatch(&self) -> usize {
        self.engine.max_ubatch()
    }

    /// Sequences the session holds at most.
    pub fn n_seq_max(&self) -> usize {
        self.kv.n_seq_max()
    }

    /// Lets the sequences share `cells` KV cells in all, as llama.cpp's unified cache
    /// (`--kv-unified`: every sequence may use the whole context, the cells of all of them
    /// together may not exceed it); `None` lifts the cap. An evaluation that would pass it
    /// fails with [`crate::kv_cache::PoolFull`] before anything is computed.
    pub fn set_kv_pool(&mut self, cells: Option<usize>) {
        self.kv.set_pool(cells);
    }

    /// Cells still free in the shared pool ([`Session::set_kv_pool`]); `None` when there is
    /// no pool.
    pub fn kv_room(&self) -> Option<usize> {
        self.kv.room()
    }

    /// The tokens sequence `seq` holds: position `i` holds token `i`.
    pub fn tokens(&self, seq: SeqId) -> &[TokenId] {
        self.kv.tokens(seq)
    }

    /// Positions sequence `seq` holds (`n_past`).
    pub fn n_past(&self, seq: SeqId) -> usize {
        self.kv.tokens(seq).len()
    }

    /// What the session holds.
    pub fn memory(&self) -> MemoryReport {
        MemoryReport {
            kv: self.kv.bytes(),
            kv_per_seq: self.kv.layout().stream_bytes,
            kv_cells_written: self.kv.cells_written() as u64,
            engine: self.engine.memory(),
        }
    }

    /// Evaluates `tokens` as the continuation of sequence `seq` (at positions
    /// `n_past..n_past + tokens.len()`) in one engine call, so at most
    /// [`Session::max_ubatch`] tokens (callers cut longer inputs, as `generate` does), and
    /// returns the logits: every token's row when `all_logits`, else the last one's.
    ///
    /// # Errors
    /// An empty call, positions past the context, a token outside the vocabulary, no free
    /// sequence slot, or what the engine reports. Tokens evaluated before an error stay in
    /// the sequence.
    pub fn eval(
        &mut self,
        seq: SeqId,
        tokens: &[TokenId],
        all_logits: bool,
    ) -> anyhow::Result<&[f32]> {
        let n_past = self.n_past(seq);
        self.decode_seq(seq, tokens, n_past, all_logits)
    }

    /// Evaluates `tokens` as the continuation of sequence `seq` with a logit row per token,
    /// each row computed as that token decoded alone ([`Engine::decode_as_singles`]): the
    /// verification of a speculative draft, whose rows are then bit for bit those of
    /// decoding the tokens one at a time. At most [`Session::max_ubatch`] tokens.
    ///
    /// # Errors
    /// As [`Session::eval`]; the sequence keeps its past on an error.
    pub fn eval_as_singles(&mut self, seq: SeqId, tokens: &[TokenId]) -> anyhow::Result<&[f32]> {
        let i = self.kv.stream_for(seq)?;
        let pos0 = self.kv.n_past(i);
        self.kv.check_room(tokens.len())?;
        let mut rows = std::mem::take(&mut self.rows);
        rows.clear();
        let mut kv = self.kv.lend(i);
        let done = self
            .engine
            .decode_as_singles(&mut kv, tokens, pos0, &mut rows);
        let written = kv.written;
        self.rows = rows;
        match done {
            Ok(()) => {
                self.kv.commit(i, tokens, written);
                Ok(&self.rows)
            }
            Err(e) => {
                // Cells the failed call wrote are zeroed; the sequence keeps its past.
                self.kv.commit(i, &[], written);
                self.truncate_stream(i, pos0);
                Err(e)
            }
        }
    }

    /// Evaluates `tokens` of sequence 0 at positions `pos0..` ([`Session::decode_seq`]).
    ///
    /// # Errors
    /// As [`Session::decode_seq`].
    pub fn decode(
        &mut self,
        tokens: &[TokenId],
        pos0: usize,
        all_logits: bool,
    ) -> anyhow::Result<&[f32]> {
        self.decode_seq(0, tokens, pos0, all_logits)
    }

    /// Evaluates `tokens` of sequence `seq` at positions `pos0..`: the sequence is first
    /// truncated to `pos0` positions if it holds more. One engine call: at most
    /// [`Session::max_ubatch`] tokens.
    ///
    /// # Errors
    /// `pos0` past the sequence's `n_past` (positions must follow one another), and what
    /// [`Engine::decode`] reports.
    pub fn decode_seq(
        &mut self,
        seq: SeqId,
        tokens: &[TokenId],
        pos0: usize,
        all_logits: bool,
    ) -> anyhow::Result<&[f32]> {
        let i = self.kv.stream_for(seq)?;
        let n_past = self.kv.n_past(i);
        anyhow::ensure!(
            pos0 <= n_past,
            "sequence {seq} holds {n_past} positions: the next token is at {n_past}, not {pos0}"
        );
        if pos0 < n_past {
            self.truncate_stream(i, pos0);
        }
        self.kv.check_room(tokens.len())?;
        let mut kv = self.kv.lend(i);
        let done = self
            .engine
            .decode(&mut kv, tokens, pos0, all_logits)
            .map(|_| ());
        let written = kv.written;
        match done {
            Ok(()) => {
                self.kv.commit(i, tokens, written);
                Ok(self.engine.last_logits())
            }
            Err(e) => {
                // Cells the failed call wrote are zeroed; the sequence keeps its past.
                self.kv.commit(i, &[], written);
                self.truncate_stream(i, pos0);
                Err(e)
            }
        }
    }

    /// Evaluates a batch of tokens of one or more sequences, each continuing its sequence,
    /// and returns the logits rows of the tokens marked `logits`, in batch order. Where the
    /// engine has mixed steps ([`Engine::mixes_runs`]) and each sequence's tokens are one
    /// run that wants only its last logits (a slot's prompt chunk, a generating slot's
    /// token), all runs go to one [`Engine::decode_runs`] call, which evaluates short ones
    /// in shared steps. Otherwise sequences with one token in the batch (the slots that are
    /// generating) are evaluated together, one engine call reading the weights once for all
    /// of them ([`Engine::decode_seqs`]); the others are cut into runs of consecutive tokens
    /// of one sequence, each evaluated against that sequence's memory (llama.cpp splits a
    /// batch per sequence the same way for a non-unified cache). Either way each sequence
    /// gets the logits it would get alone, bit for bit.
    ///
    /// # Errors
    /// As [`Session::eval`] for each run; an engine without all-token logits steps when a
    /// run asks for rows other than its last. Sequences evaluated before an error keep
    /// their tokens; the failing call's sequences are left as they were.
    pub fn decode_batch(&mut self, batch: &[BatchToken]) -> anyhow::Result<Vec<f32>> {
        let mut out = Vec::new();
        self.decode_batch_into(batch, &mut out)?;
        Ok(out)
    }

    /// [`Session::decode_batch`] into `out` (its contents replaced): a caller that steps
    /// many times (the server) passes the same vector each time, and the rows are written
    /// where the last step's were. On an error `out`'s contents are unspecified.
    ///
    /// # Errors
    /// As [`Session::decode_batch`].
    pub fn decode_batch_into(
        &mut self,
        batch: &[BatchToken],
        out: &mut Vec<f32>,
    ) -> anyhow::Result<()> {
        let n_vocab = self.n_vocab();
        // Where each token's logits go in the result.
        let mut row_of = Vec::with_capacity(batch.len());
        let mut n_rows = 0;
        for b in batch {
            row_of.push(b.logits.then_some(n_rows));
            n_rows += usize::from(b.logits);
        }
        out.clear();
        if self.engine.mixes_runs() {
            if let Some(runs) = self.mixable_runs(batch) {
                if n_rows == runs.len() {
                    // Every run's last token wants logits: the engine's rows are the result.
                    return self.decode_runs(batch, &runs, out);
                }
                out.resize(n_rows * n_vocab, 0.0);
                let place: Vec<Option<usize>> =
                    runs.iter().map(|&(_, end)| row_of[end - 1]).collect();
                return self
                    .decode_placed(out, &place, |s, rows| s.decode_runs(batch, &runs, rows));
            }
        }
        out.resize(n_rows * n_vocab, 0.0);
        let mut count: std::collections::HashMap<SeqId, usize> = Default::default();
        for b in batch {
            *count.entry(b.seq).or_default() += 1;
        }
        let single: Vec<usize> = (0..batch.len())
            .filter(|&i| count[&batch[i].seq] == 1)
            .collect();
        if single.len() >= 2 {
            let place: Vec<Option<usize>> = single.iter().map(|&i| row_of[i]).collect();
            self.decode_placed(out, &place, |s, rows| {
                s.decode_singles(batch, &single, rows)
            })?;
        }
        let mut start = 0;
        while start < batch.len() {
            let seq = batch[start].seq;
            let mut end = start + 1;
            while end < batch.len() && batch[end].seq == seq && end - start < self.max_ubatch() {
                end += 1;
            }
            if single.len() >= 2 && count[&seq] == 1 {
                start = end;
                continue;
            }
            let run = &batch[start..end];
            let tokens: Vec<TokenId> = run.iter().map(|b| b.token).collect();
            let only_last = run[..run.len() - 1].iter().all(|b| !b.logits);
            let logits = self.eval(seq, &tokens, !only_last)?;
            for (j, b) in run.iter().enumerate() {
                let (Some(r), true) = (row_of[start + j], b.logits) else {
                    continue;
                };
                let src = if only_last { 0 } else { j };
                out[r * n_vocab..(r + 1) * n_vocab]
                    .copy_from_slice(&logits[src * n_vocab..(src + 1) * n_vocab]);
            }
            start = end;
        }
        Ok(())
    }

    /// Runs `decode` with the session's kept rows vector (emptied) and,
    /// when it succeeds, copies its row `j` to row `r` of `out` for each `place[j]` that is
    /// `Some(r)`.
    fn decode_placed(
        &mut self,
        out: &mut [f32],
        place: &[Option<usize>],
        decode: impl FnOnce(&mut Self, &mut Vec<f32>) -> anyhow::Result<()>,
    ) -> anyhow::Result<()> {
        let n_vocab = self.n_vocab();
        let mut rows = std::mem::take(&mut self.rows);
        rows.clear();
        let done = decode(self, &mut rows);
        if done.is_ok() {
            for (j, r) in place.iter().enumerate() {
                if let Some(r) = *r {
                    out[r * n_vocab..(r + 1) * n_vocab]
                        .copy_from_slice(&rows[j * n_vocab..(j + 1) * n_vocab]);
                }
            }
        }
        self.rows = rows;
        done
    }

    /// The batch cut into runs of consecutive tokens of one sequence (`batch[start..end]`),
    /// where every sequence makes one run of at most [`Session::max_ubatch`] tokens that
    /// asks for no logits but its last token's (and there are at least two runs); else
    /// `None`.
    fn mixable_runs(&self, batch: &[BatchToken]) -> Option<Vec<(usize, usize)>> {
        let mut runs: Vec<(usize, usize)> = Vec::new();
        let mut seen = std::collections::HashSet::new();
        let mut start = 0;
        while start < batch.len() {
            let seq = batch[start].seq;
            let mut end = start + 1;
            while end < batch.len() && batch[end].seq == seq {
                end += 1;
            }
            let first_logits = batch[start..end - 1].iter().any(|b| b.logits);
            if !seen.insert(seq) || end - start > self.max_ubatch() || first_logits {
                return None;
            }
            runs.push((start, end));
            start = end;
        }
        (runs.len() >= 2).then_some(runs)
    }

    /// The runs `batch[start..end]` of distinct sequences in one [`Engine::decode_runs`]
    /// call; appends each run's last logit row to `rows`, in order. On an error every run's
    /// sequence is left as it was.
    fn decode_runs(
        &mut self,
        batch: &[BatchToken],
        runs: &[(usize, usize)],
        rows: &mut Vec<f32>,
    ) -> anyhow::Result<()> {
        let mut streams = Vec::with_capacity(runs.len());
        for &(start, _) in runs {
            streams.push(self.kv.stream_for(batch[start].seq)?);
        }
        let positions: Vec<usize> = streams.iter().map(|&s| self.kv.n_past(s)).collect();
        let tokens: Vec<Vec<TokenId>> = runs
            .iter()
            .map(|&(a, b)| batch[a..b].iter().map(|t| t.token).collect())
            .collect();
        self.kv.check_room(batch.len())?;
        let seq_runs: Vec<SeqRun<'_>> = tokens
            .iter()
            .zip(&positions)
            .map(|(t, &pos0)| SeqRun { tokens: t, pos0 })
            .collect();
        let mut kvs = self.kv.lend_many(&streams)?;
        let done = self.engine.decode_runs(&mut kvs, &seq_runs, rows);
        let written: Vec<usize> = kvs.iter().map(|k| k.written).collect();
        drop(kvs);
        for (j, &s) in streams.iter().enumerate() {
            match done {
                Ok(()) => self.kv.commit(s, &tokens[j], written[j]),
                Err(_) => {
                    // Cells the failed call wrote are zeroed; each sequence keeps its past.
                    self.kv.commit(s, &[], written[j]);
                    self.truncate_stream(s, positions[j]);
                }
            }
        }
        done
    }

    /// One token of each of the sequences of `batch[i]` for `i` in `which` (distinct
    /// sequences), in one [`Engine::decode_seqs`] call; appends their logit rows to `rows`,
    /// in order.
    fn decode_singles(
        &mut self,
        batch: &[BatchToken],
        which: &[usize],
        rows: &mut Vec<f32>,
    ) -> anyhow::Result<()> {
        let mut streams = Vec::with_capacity(which.len());
        for &i in which {
            streams.push(self.kv.stream_for(batch[i].seq)?);
        }
        let positions: Vec<usize> = streams.iter().map(|&s| self.kv.n_past(s)).collect();
        let tokens: Vec<TokenId> = which.iter().map(|&i| batch[i].token).collect();
        self.kv.check_room(tokens.len())?;
        let mut kvs = self.kv.lend_many(&streams)?;
        let done = self.engine.decode_seqs(&mut kvs, &tokens, &positions, rows);
        let written: Vec<usize> = kvs.iter().map(|k| k.written).collect();
        drop(kvs);
        for (j, &s) in streams.iter().enumerate() {
            match done {
                Ok(()) => self.kv.commit(s, &tokens[j..j + 1], written[j]),
                Err(_) => {
                    // Cells the failed call wrote are zeroed; each sequence keeps its past.
                    self.kv.commit(s, &[], written[j]);
                    self.truncate_stream(s, positions[j]);
                }
            }
        }
        done
    }

    /// Truncates sequence `seq` to its first `n` positions (no-op for a sequence holding
    /// fewer); cells from `n` on are zeroed.
    pub fn truncate(&mut self, seq: SeqId, n: usize) {
        if let Some(i) = self.kv.stream_of(seq) {
            self.truncate_stream(i, n);
        }
    }

    /// Cuts stream `i` back to `n` positions. Where a sliding-window ring no longer holds
    /// the positions the next token would attend to (overwritten by later ones:
    /// [`ir::plan::KvLayout::can_truncate`]), the stream is emptied and its first `n` tokens
    /// evaluated again, as llama-server re-processes a prompt whose cache it cannot partly
    /// reuse; if that fails the stream stays empty (a later call at position `n` then fails
    /// with a clear error, never with wrong numbers).
    fn truncate_stream(&mut self, i: usize, n: usize) {
        let written = self.kv.written(i) as u64;
        if self.kv.layout().can_truncate(n as u64, written) {
            self.kv.truncate(i, n);
            self.engine.forget(i, n);
            return;
        }
        let seq = self.kv.seq_of(i);
        let n_past = self.kv.n_past(i);
        let keep: Vec<TokenId> = match seq {
            Some(s) => self.kv.tokens(s)[..n.min(n_past)].to_vec(),
            None => Vec::new(),
        };
        self.kv.truncate(i, 0);
        self.engine.forget(i, 0);
        let Some(seq) = seq else { return };
        let step = self.max_ubatch().max(1);
        for (c, part) in keep.chunks(step).enumerate() {
            if self.decode_seq(seq, part, c * step, false).is_err() {
                self.kv.truncate(i, 0);
                self.engine.forget(i, 0);
                return;
            }
        }
    }

    /// Context shift (llama.cpp's, in `llama-completion`): keeps the first `n_keep`
    /// positions of sequence `seq`, drops the next `n_discard`, and moves the rest down to
    /// follow the kept ones. The moved keys are re-roped by `-n_discard` positions as
    /// llama.cpp's K shift does when the engine can; otherwise the moved positions are
    /// evaluated again. Returns whether the keys were re-roped.
    ///
    /// # Errors
    /// An engine error.
    pub fn shift(&mut self, seq: SeqId, n_keep: usize, n_discard: usize) -> anyhow::Result<bool> {
        let Some(i) = self.kv.stream_of(seq) else {
            return Ok(false);
        };
        let n_past = self.kv.n_past(i);
        let n_keep = n_keep.min(n_past);
        let n_discard = n_discard.min(n_past - n_keep);
        if n_discard == 0 {
            return Ok(false);
        }
        let src = n_keep + n_discard;
        if self.kv.layout().has_ring() {
            // Cells of a ring do not lie in position order: the positions kept are
            // evaluated again instead of moved.
            let held = self.kv.tokens(seq).to_vec();
            self.truncate_stream(i, n_keep);
            for part in held[src..].chunks(self.max_ubatch().max(1)) {
                self.eval(seq, part, false)?;
            }
            return Ok(false);
        }
        let mut kv = self.kv.lend(i);
        let roped = self
            .engine
            .shift_k(&mut kv, src, n_past - src, -(n_discard as i64))?;
        if roped {
            self.kv.shift(i, n_keep, n_discard);
            self.engine.forget(i, n_past - n_discard);
            return Ok(true);
        }
        let held = self.kv.tokens(seq).to_vec();
        self.truncate_stream(i, n_keep);
        for part in held[src..].chunks(self.max_ubatch().max(1)) {
            self.eval(seq, part, false)?;
        }
        Ok(false)
    }

    /// Empties sequence `seq` and frees its memory for another sequence.
    pub fn clear_seq(&mut self, seq: SeqId) {
        if let Some(i) = self.kv.stream_of(seq) {
            self.kv.release(i);
            self.engine.forget(i, 0);
        }
    }

    /// Empties every sequence.
    pub fn clear(&mut self) {
        for i in 0..self.kv.n_seq_max() {
            self.kv.release(i);
            self.engine.forget(i, 0);
        }
    }
}
