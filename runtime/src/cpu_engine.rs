//! The compiled CPU plan ([`codegen_cpu::exec::CompiledPlan`]) as an [`Engine`]: what
//! `modelc compile` runners and `modelc run` execute.
//!
//! Each [`Engine::decode`] call is cut into steps of the compiled ubatch sizes by
//! [`ir::plan::schedule::chunks`] (full chunks of the largest size, then the tail padded to a
//! compiled size as the plan's [`ir::plan::TailPolicy::Pad`] says, or run with smaller sizes;
//! single tokens through ubatch 1). The KV memory is the session's, lent to each call
//! ([`KvStream`]).
//!
//! A plan's steps produce either one logit row (the last real token: generation) or one row
//! per token (perplexity, teacher forcing); [`build_plan`] can compile both kinds into one
//! plan ([`LogitRows::Both`]). A call asking for all rows from a plan that only has
//! last-row steps fails with a clear error, and vice versa.

use crate::engine::{
    check_decode_args, check_runs_args, check_seqs_args, Engine, EngineMemory, KvStream, SeqRun,
};

/// llama.cpp's default `n_ubatch` (`-ub`): it decodes a call in ubatches of this many tokens,
/// and its flash-attention kernel choice depends on the ubatch's size.
pub const LLAMA_N_UBATCH: usize = 512;
use anyhow::Context;
use codegen_cpu::exec::{CompiledPlan, ExecOptions, RowRun, StepArgs};
use codegen_cpu::SumOrder;
use compiler::passes::{compile, CompileOptions};
use ir::graph::KvTypes;
use ir::interp::WeightSource;
use ir::plan::schedule::chunks;
use ir::plan::{Base, KvLayout, Plan, WeightId};

pub use crate::backend::LogitRows;

/// Builds the plan of `model` for the ubatch sizes `ubatches` and a KV cache of `n_ctx`
/// cells of `kv_types` (F16 is llama.cpp's default), by running [`compiler::passes::compile`].
///
/// # Errors
/// What the passes report (bad sizes, unsupported graphs), or a merged plan that does not
/// verify.
pub fn build_plan(
    model: &compiler::Model,
    ubatches: &[u32],
    n_ctx: u32,
    kv_types: KvTypes,
    logits: LogitRows,
) -> anyhow::Result<Plan> {
    let opts = CompileOptions {
        ubatches: ubatches.to_vec(),
        n_ctx,
        kv_types,
        ..CompileOptions::default()
    };
    build_plan_with(model, &opts, logits, &mut |_, _| {})
}

/// [`build_plan`] from full compile options (their `all_logits` is set from `logits`),
/// calling `after` after every pass of the first compilation (`modelc compile
/// --dump-after`).
///
/// # Errors
/// As [`build_plan`].
pub fn build_plan_with(
    model: &compiler::Model,
    opts: &CompileOptions,
    logits: LogitRows,
    after: &mut dyn FnMut(&compiler::passes::Pass, &compiler::passes::Module),
) -> anyhow::Result<Plan> {
    let with = |all_logits: bool| CompileOptions {
        all_logits,
        ..opts.clone()
    };
    let first =
        compile(model, &with(logits == LogitRows::All), after).context("compiling the plan")?;
    if logits != LogitRows::Both {
        return Ok(first);
    }
    let mut a = first;
    let b = compile(model, &with(true), &mut |_, _| {}).context("compiling the plan")?;
    merge_steps(&mut a, b)?;
    Ok(a)
}

/// Adds the steps of `b` that `a` lacks to `a`, renumbering weights and KV caches by name
/// (how a program gets steps for both kinds of logits).
///
/// # Errors
/// A KV cache that differs between the plans, or a merged plan that does not verify.
pub fn merge_steps(a: &mut Plan, b: Plan) -> anyhow::Result<()> {
    let mut wmap = Vec::with_capacity(b.weights.len());
    for w in &b.weights {
        let id = match a.weight(&w.name) {
            Some(id) => id,
            None => {
                a.weights.push(w.clone());
                WeightId(a.weights.len() as u32 - 1)
            }
        };
        wmap.push(id);
    }
    let mut kmap = Vec::with_capacity(b.kv.len());
    for c in &b.kv {
        let id = match a.kv.iter().position(|x| x.name == c.name) {
            Some(i) => {
                anyhow::ensure!(
                    a.kv[i] == *c,
                    "KV cache {} differs between the two plans",
                    c.name
                );
                i
            }
            None => {
                a.kv.push(c.clone());
                a.kv.len() - 1
            }
        };
        kmap.push(ir::plan::KvId(id as u32));
    }
    for mut s in b.steps {
        if a.step(s.n_tokens, s.n_outputs).is_some() {
            continue;
        }
        for v in &mut s.values {
            v.base = match v.base {
                Base::Weight(w) => Base::Weight(wmap[w.index()]),
                Base::Kv(k) => Base::Kv(kmap[k.index()]),
                other => other,
            };
        }
        a.steps.push(s);
    }
    a.steps.sort_by_key(|s| (s.n_tokens, s.n_outputs));
    a.verify().context("the merged plan does not verify")?;
    Ok(())
}

/// A compiled plan with its KV cache, evaluating tokens (module doc).
pub struct CpuEngine<'a> {
    exec: CompiledPlan<'a>,
    /// Token ids are below this (`token_embd.weight`'s rows).
    n_vocab: usize,
    /// Values per output row: `n_vocab` for logits, `n_embd` for a plan of hidden states
    /// (`compiler::GraphOutput::Embeddings`).
    row_len: usize,
    n_ctx: usize,
    /// Sizes of the steps with one logit row, increasing.
    last_sizes: Vec<u32>,
    /// Sizes of the steps with a row per token, increasing.
    all_sizes: Vec<u32>,
    /// The plan attends without a causal mask (an encoder such as bert): a call's tokens
    /// must be one step, whose KV length stops at the last real token so that no real token
    /// sees the padding (llama.cpp masks the padding of its cache-less attention).
    non_causal: bool,
    logits: Vec<f32>,
    tokens: Vec<i32>,
    positions: Vec<i32>,
    out_ids: Vec<i32>,
}

/// Whether any step of `plan` attends without a causal mask.
fn has_non_causal_attention(plan: &Plan) -> bool {
    plan.steps.iter().flat_map(|s| &s.kernels).any(|k| {
        matches!(
            &k.op,
            ir::plan::KernelOp::Op(ir::graph::Op::Attention(p)) if !p.causal
        )
    })
}

impl<'a> CpuEngine<'a> {
    /// Compiles `plan` (built for the model in `gguf`, e.g. by [`build_plan`]) on
    /// `n_threads` threads; the caller keeps `gguf` alive (its embedding table is read in
    /// place). `gguf` is a [`GgufFile`](ir::gguf::GgufFile), or a
    /// [`ReleasingGguf`](crate::engine_weights::ReleasingGguf) over one to keep the file's
    /// pages out of the resident set.
    ///
    /// # Errors
    /// What [`CompiledPlan::new`] reports (a kernel the CPU backend cannot run, a weight the
    /// file lacks or holds with another type or shape), or a plan without logits.
    pub fn new(
        gguf: &'a dyn WeightSource,
        plan: Plan,
        n_threads: usize,
    ) -> anyhow::Result<CpuEngine<'a>> {
        Self::with_sum_order(gguf, plan, n_threads, SumOrder::Ggml)
    }

    /// [`CpuEngine::new`] with quantized matmul kernels adding in `order`
    /// ([`CompiledPlan::with_sum_order`]): `SumOrder::Block` is faster and not bit-identical
    /// to llama.cpp.
    ///
    /// # Errors
    /// As [`CpuEngine::new`].
    pub fn with_sum_order(
        gguf: &'a dyn WeightSource,
        plan: Plan,
        n_threads: usize,
        order: SumOrder,
    ) -> anyhow::Result<CpuEngine<'a>> {
        Self::load(
            gguf,
            plan,
            &ExecOptions {
                n_threads,
                order,
                n_cells: None,
                kv_ring_ubatch: None,
            },
        )
    }

    /// [`CpuEngine::new`] with every option of [`CompiledPlan::load`]: threads, the sum
    /// order of the quantized kernels, and the context (`n_cells`, at most the plan's
    /// `n_ctx`: a smaller context needs no new plan).
    ///
    /// # Errors
    /// As [`CpuEngine::new`]; a context of 0 or past the plan's.
    pub fn load(
        gguf: &'a dyn WeightSource,
        plan: Plan,
        opts: &ExecOptions,
    ) -> anyhow::Result<CpuEngine<'a>> {
        let first = plan.steps.first().context("the plan has no steps")?;
        let logits = first
            .outputs
            .first()
            .context("the plan's steps have no logits output")?;
        let row_len = first.values[logits.index()].shape.ne[0] as usize;
        // A plan of hidden states has rows of n_embd values; the tokens are still bounded
        // by the embedding table.
        let n_vocab = plan
            .weight("token_embd.weight")
            .map_or(row_len, |w| plan.weights[w.0 as usize].shape.ne[1] as usize);
        let mut last_sizes = Vec::new();
        let mut all_sizes = Vec::new();
        let mut max_rows = 0;
        for s in &plan.steps {
            if s.n_outputs == 1 {
                last_sizes.push(s.n_tokens);
            }
            if s.n_outputs == s.n_tokens {
                all_sizes.push(s.n_tokens);
            }
            max_rows = max_rows.max(s.n_tokens as usize);
        }
        last_sizes.sort_unstable();
        all_sizes.sort_unstable();
        let non_causal = has_non_causal_attention(&plan);
        let exec =
            CompiledPlan::load(&plan, gguf, opts).context("compiling the plan for the CPU")?;
        Ok(CpuEngine {
            n_ctx: exec.n_ctx(),
            exec,
            n_vocab,
            row_len,
            last_sizes,
            all_sizes,
            non_causal,
            logits: Vec::with_capacity(row_len * max_rows),
            tokens: Vec::with_capacity(max_rows),
            positions: Vec::with_capacity(max_rows),
            out_ids: Vec::with_capacity(max_rows),
        })
    }

    /// Attention as llama.cpp's CPU flash attention (`true`, the default, as llama.cpp's
    /// `-fa auto`) or its soft_max path (`-fa off`); see
    /// [`CompiledPlan::set_flash_attn`].
    ///
    /// # Errors
    /// `false` with a quantized KV cache (only the flash kernels read one).
    pub fn set_flash_attn(&mut self, on: bool) -> anyhow::Result<()> {
        self.exec.set_flash_attn(on).map_err(|e| match e {
            codegen_cpu::exec::ExecError::Input(m) => anyhow::anyhow!(m),
            e => e.into(),
        })
    }

    /// Values per output row: `n_vocab` for a plan of logits, `n_embd` for a plan of
    /// hidden states (`compiler::GraphOutput::Embeddings`, whose rows
    /// [`Engine::decode`] returns instead of logits).
    pub fn row_len(&self) -> usize {
        self.row_len
    }

    /// The compiled plan (load statistics, per-kernel profile).
    pub fn compiled(&self) -> &CompiledPlan<'a> {
        &self.exec
    }

    /// The compiled plan, mutably (to turn profiling on).
    pub fn compiled_mut(&mut self) -> &mut CompiledPlan<'a> {
        &mut self.exec
    }
}

/// Runs of a mixed step are shorter than this (llama.cpp's tiled flash-attention kernel,
/// which longer ubatches take, is not in the mixed step: `flash::Q_TILE`).
const MIXED_RUN_MAX: usize = 64;

impl CpuEngine<'_> {
    /// The smallest step with a logit row per token that holds `total` tokens (0: none).
    fn padded_size(&self, total: usize) -> usize {
        self.all_sizes
            .iter()
            .map(|&s| s as usize)
            .filter(|&s| s >= total)
            .min()
            .unwrap_or(0)
    }

    /// `runs` (of `total` tokens, at most the largest step) in one mixed step: each run the
    /// whole of its llama.cpp ubatch; appends each run's last logit row to `out`.
    fn step_mixed(
        &mut self,
        kvs: &mut [KvStream<'_>],
        runs: &[SeqRun<'_>],
        total: usize,
        out: &mut Vec<f32>,
    ) -> anyhow::Result<()> {
        let size = match self.padded_size(total) {
            0 => anyhow::bail!("no step holds {total} tokens"),
            s => s as u32,
        };
        self.tokens.clear();
        self.positions.clear();
        let mut rows = Vec::with_capacity(runs.len());
        for r in runs {
            rows.push(RowRun {
                start: self.tokens.len(),
                len: r.tokens.len(),
                n_llama: r.tokens.len(),
                col0: 0,
            });
            self.tokens.extend(r.tokens.iter().map(|&t| t as i32));
            self.positions
                .extend((r.pos0..r.pos0 + r.tokens.len()).map(|p| p as i32));
        }
        // Padding rows repeat the last real row (they store nothing).
        let (pad_t, pad_p) = (self.tokens[total - 1], self.positions[total - 1]);
        self.tokens.resize(size as usize, pad_t);
        self.positions.resize(size as usize, pad_p);
        // Each run's output row first (only those reach the head), then repeats.
        self.out_ids.clear();
        self.out_ids
            .extend(rows.iter().map(|r| (r.start + r.len - 1) as i32));
        self.out_ids.resize(size as usize, (total - 1) as i32);
        let kv_len = runs
            .iter()
            .map(|r| r.pos0 + r.tokens.len())
            .max()
            .unwrap_or(1);
        let args = StepArgs {
            tokens: &self.tokens,
            positions: &self.positions,
            output_ids: &self.out_ids,
            kv_len,
            data: &[],
        };
        // Marked before the step: a failed step may have stored its rows.
        for (kv, r) in kvs.iter_mut().zip(runs) {
            kv.written = kv.written.max(r.pos0 + r.tokens.len());
        }
        let mut mems: Vec<&mut [u8]> = kvs.iter_mut().map(|k| &mut *k.mem).collect();
        let logits = self.exec.step_runs(&mut mems, &rows, size, &args)?;
        out.extend_from_slice(&logits[..rows.len() * self.row_len]);
        Ok(())
    }
}

impl Engine for CpuEngine<'_> {
    fn n_vocab(&self) -> usize {
        self.n_vocab
    }

    fn n_ctx(&self) -> usize {
        self.n_ctx
    }

    /// llama.cpp's ubatch ([`LLAMA_N_UBATCH`]), or the largest compiled step if larger: a
    /// call is cut into compiled steps here, and llama.cpp's kernel choices follow the
    /// call's size, so callers must not cut a prompt into compiled-step-sized calls.
    fn max_ubatch(&self) -> usize {
        self.last_sizes
            .iter()
            .chain(&self.all_sizes)
            .map(|&s| s as usize)
            .max()
            .unwrap_or(1)
            .max(LLAMA_N_UBATCH)
    }

    fn kv_layout(&self) -> &KvLayout {
        self.exec.kv_layout()
    }

    fn shift_k(
        &mut self,
        kv: &mut KvStream<'_>,
        from: usize,
        n: usize,
        delta: i64,
    ) -> anyhow::Result<bool> {
        Ok(self.exec.shift_k(kv.mem, from, n, delta)?)
    }

    fn last_logits(&self) -> &[f32] {
        &self.logits
    }

    fn memory(&self) -> EngineMemory {
        let s = self.exec.stats();
        EngineMemory {
            weights: s.repacked_bytes as u64,
            work: (s.arena_bytes + s.scratch_bytes) as u64,
        }
    }

    fn mixes_runs(&self) -> bool {
        true
    }

    /// Runs of fewer than 64 tokens go through the plan's mixed steps
    /// ([`CompiledPlan::step_runs`]), packed in order into the smallest step with a logit
    /// row per token that holds them, padded to at most twice their tokens; a longer run, a
    /// run alone, and the prompt chunks of a model with sliding-window ring caches (whose
    /// prompts llama.cpp cuts its own way) are decoded alone.
    fn decode_runs(
        &mut self,
        kvs: &mut [KvStream<'_>],
        runs: &[SeqRun<'_>],
        out: &mut Vec<f32>,
    ) -> anyhow::Result<()> {
        check_runs_args(kvs, runs)?;
        for r in runs {
            check_decode_args(self, r.tokens, r.pos0)?;
        }
        if self.non_causal {
            // No mixed steps: each sequence alone, as one ubatch.
            for (kv, r) in kvs.iter_mut().zip(runs) {
                let rows = self.decode(kv, r.tokens, r.pos0, false)?;
                out.extend_from_slice(rows);
            }
            return Ok(());
        }
        let max = self.all_sizes.iter().copied().max().unwrap_or(0) as usize;
        let layout = self.exec.kv_layout();
        let ring = layout.caches.iter().any(|c| c.n_cells < layout.n_cells);
        let mixable = |r: &SeqRun<'_>| {
            let n = r.tokens.len();
            (n == 1 || !ring && n < MIXED_RUN_MAX) && n <= max
        };
        let mut i = 0;
        while i < runs.len() {
            let mut j = i;
            let mut total = 0;
            while j < runs.len() && mixable(&runs[j]) && total + runs[j].tokens.len() <= max {
                total += runs[j].tokens.len();
                j += 1;
            }
            // At most as many padding rows as real ones (the elementwise kernels and some
            // products cost padding rows as much as real ones): the last runs wait for
            // the next step.
            while j > i + 1 && self.padded_size(total) > 2 * total {
                j -= 1;
                total -= runs[j].tokens.len();
            }
            if j <= i + 1 {
                let logits = self.decode(&mut kvs[i], runs[i].tokens, runs[i].pos0, false)?;
                out.extend_from_slice(logits);
                i += 1;
                continue;
            }
            self.step_mixed(&mut kvs[i..j], &runs[i..j], total, out)?;
            i = j;
        }
        Ok(())
    }

    /// Tokens of one sequence in the smallest step with a logit row per token that holds
    /// them, each row its own one-token ubatch ([`CompiledPlan::step_rows_one_seq`]); one
    /// at a time where no step holds them within twice their number, or for one token.
    fn decode_as_singles(
        &mut self,
        kv: &mut KvStream<'_>,
        tokens: &[u32],
        pos0: usize,
        out: &mut Vec<f32>,
    ) -> anyhow::Result<()> {
        check_decode_args(self, tokens, pos0)?;
        anyhow::ensure!(
            !self.non_causal,
            "a model without causal attention has no token-by-token decoding"
        );
        let n = tokens.len();
        let size = self.padded_size(n);
        if n == 1 || size == 0 || size > 2 * n {
            for (i, &t) in tokens.iter().enumerate() {
                let logits = self.decode(kv, &[t], pos0 + i, false)?;
                out.extend_from_slice(logits);
            }
            return Ok(());
        }
        self.tokens.clear();
        self.tokens.extend(tokens.iter().map(|&t| t as i32));
        self.positions.clear();
        self.positions.extend((pos0..pos0 + n).map(|p| p as i32));
        // Padding rows repeat the last real row (they store nothing).
        let (pad_t, pad_p) = (self.tokens[n - 1], self.positions[n - 1]);
        self.tokens.resize(size, pad_t);
        self.positions.resize(size, pad_p);
        self.out_ids.clear();
        self.out_ids.extend((0..n).map(|i| i as i32));
        self.out_ids.resize(size, (n - 1) as i32);
        let args = StepArgs {
            tokens: &self.tokens,
            positions: &self.positions,
            output_ids: &self.out_ids,
            kv_len: pos0 + n,
            data: &[],
        };
        // Marked before the step: a failed step may have stored its rows.
        kv.written = kv.written.max(pos0 + n);
        let logits = self.exec.step_rows_one_seq(kv.mem, n, size as u32, &args)?;
        out.extend_from_slice(&logits[..n * self.row_len]);
        Ok(())
    }

    /// One-token runs through [`Engine::decode_runs`]: groups of them share the plan's
    /// steps with a logit row per token.
    fn decode_seqs(
        &mut self,
        kvs: &mut [KvStream<'_>],
        tokens: &[u32],
        positions: &[usize],
        out: &mut Vec<f32>,
    ) -> anyhow::Result<()> {
        check_seqs_args(kvs, tokens, positions)?;
        let runs: Vec<SeqRun<'_>> = tokens
            .iter()
            .zip(positions)
            .map(|(t, &pos0)| SeqRun {
                tokens: std::slice::from_ref(t),
                pos0,
            })
            .collect();
        self.decode_runs(kvs, &runs, out)
    }

    fn decode(
        &mut self,
        kv: &mut KvStream<'_>,
        tokens: &[u32],
        pos0: usize,
        all_logits: bool,
    ) -> anyhow::Result<&[f32]> {
        check_decode_args(self, tokens, pos0)?;
        let sizes = crate::engine::step_sizes(
            &self.all_sizes,
            &self.last_sizes,
            all_logits,
            " (build the plan with LogitRows::Both)",
        )?;
        anyhow::ensure!(
            !self.non_causal || pos0 == 0,
            "a model without causal attention evaluates a whole sequence at once (position {pos0} given)"
        );
        // One token (generation): its own step, without building a schedule.
        if tokens.len() == 1 && sizes.first() == Some(&1) {
            self.tokens.clear();
            self.tokens.push(tokens[0] as i32);
            self.positions.clear();
            self.positions.push(pos0 as i32);
            self.out_ids.clear();
            self.out_ids.push(0);
            let args = StepArgs {
                tokens: &self.tokens,
                positions: &self.positions,
                output_ids: &self.out_ids,
                kv_len: pos0 + 1,
                data: &[],
            };
            let out = self.exec.step(kv.mem, 1, 1, &args)?;
            kv.written = kv.written.max(pos0 + 1);
            self.logits.clear();
            self.logits.extend_from_slice(&out[..self.row_len]);
            return Ok(&self.logits);
        }
        let cut = chunks(sizes, pos0 as u32, tokens.len() as u32, self.n_ctx as u32)?;
        if self.non_causal {
            anyhow::ensure!(
                pos0 == 0 && cut.len() == 1,
                "a model without causal attention takes its input in one ubatch: {} tokens at position {pos0} do not fit one step of {:?} (raise -ub)",
                tokens.len(),
                sizes
            );
        }
        self.logits.clear();
        let mut done = 0usize;
        let row_len = self.row_len;
        for (ci, c) in cut.iter().enumerate() {
            let n_real = c.n_real as usize;
            let real = &tokens[done..done + n_real];
            self.tokens.clear();
            self.tokens.extend(real.iter().map(|&t| t as i32));
            let pad = *self.tokens.last().unwrap_or(&0);
            self.tokens.resize(c.n_tokens as usize, pad);
            self.positions.clear();
            self.positions
                .extend((0..c.n_tokens).map(|i| (c.pos0 + i) as i32));
            self.out_ids.clear();
            let n_outputs = if all_logits {
                self.out_ids.extend(0..c.n_tokens as i32);
                c.n_tokens
            } else {
                self.out_ids.push(c.n_real as i32 - 1);
                1
            };
            let args = StepArgs {
                tokens: &self.tokens,
                positions: &self.positions,
                output_ids: &self.out_ids,
                // Without a causal mask the KV length stops at the last real token: the
                // padding rows store past it, where no real token looks.
                kv_len: if self.non_causal {
                    (c.pos0 + c.n_real) as usize
                } else {
                    c.kv_len() as usize
                },
                data: &[],
            };
            // llama.cpp cuts the call into ubatches of LLAMA_N_UBATCH tokens; the size of the
            // one this step falls in chooses the attention kernel.
            let g0 = done / LLAMA_N_UBATCH * LLAMA_N_UBATCH;
            let n_llama = (tokens.len() - g0).min(LLAMA_N_UBATCH);
            let col0 = done - g0;
            let last = ci + 1 == cut.len();
            if !all_logits && !last {
                // No logits wanted from this part of the prompt: the step stops after the
                // KV stores (llama.cpp computes no output for such a ubatch either).
                self.exec
                    .prefill_real(kv.mem, c.n_tokens, n_outputs, n_real, n_llama, col0, &args)?;
                kv.written = kv.written.max((c.pos0 + c.n_tokens) as usize);
                done += n_real;
                continue;
            }
            let out = self
                .exec
                .step_real(kv.mem, c.n_tokens, n_outputs, n_real, n_llama, col0, &args)?;
            // Padding rows are stored too, at the positions after the real ones.
            kv.written = kv.written.max((c.pos0 + c.n_tokens) as usize);
            if all_logits {
                self.logits.extend_from_slice(&out[..n_real * row_len]);
            } else if last {
                self.logits.extend_from_slice(&out[..row_len]);
            }
            done += n_real;
        }
        Ok(&self.logits)
    }
}
