//! KL divergence of a model's next-token distributions from a base model's, as
//! llama-perplexity measures quantization quality (`tools/perplexity/perplexity.cpp`:
//! `--kl-divergence-base FILE` saves the base's log-probabilities, `--kl-divergence` reads
//! them back while evaluating another model on the same tokens).
//!
//! The file ([`BaseWriter`], [`BaseReader`]) is llama-perplexity's, so either tool reads the
//! other's: all little-endian,
//!
//! ```text
//! "_logits_"                      8 bytes
//! n_ctx                           u32
//! n_vocab, n_chunk                i32, i32
//! tokens                          i32 × n_chunk·n_ctx (the text's tokens, before BOS replaces any)
//! per chunk, per scored token     u16 × nv, nv = 2·⌈n_vocab/2⌉ + 4
//! ```
//!
//! A chunk scores its tokens `n_ctx/2 .. n_ctx-1` (the logits of positions `n_ctx/2 ..
//! n_ctx-2`, as [`crate::perplexity`]). Each row starts with two f32 (in the first four u16):
//! `scale` and `min_log_prob`; then log-probability `i` is `scale·q[i] + min_log_prob`, where
//! the logits are clipped 16 below their maximum and spread over 0..=65535
//! ([`quantize_log_probs`]).
//!
//! [`Kld::add`] accumulates, per scored token, what llama-perplexity does: both NLLs, KL(base
//! ‖ model) over the base tokens above e⁻¹⁶, whether both put the same token on top, and Δp
//! (the model's probability of the actual next token minus the base's); [`Kld::summary`]
//! prints its statistics in its layout.

use anyhow::{bail, Context};
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

/// The file's magic.
pub const MAGIC: &[u8; 8] = b"_logits_";

/// u16 values per scored token: `2·⌈n_vocab/2⌉ + 4` (the row's two f32 first).
pub fn row_len(n_vocab: usize) -> usize {
    2 * n_vocab.div_ceil(2) + 4
}

/// Scored tokens per chunk of `n_ctx`: positions `n_ctx/2 ..= n_ctx-2` predict the next.
pub fn scored_per_chunk(n_ctx: usize) -> usize {
    n_ctx - 1 - n_ctx / 2
}

/// ggml's `nearest_int`: round to nearest (ties to even) through the float adder, for
/// `|x| < 2²²`.
fn nearest_int(x: f32) -> i32 {
    let bits = (x + 12_582_912.0f32).to_bits() as i32;
    (bits & 0x007f_ffff) - 0x0040_0000
}

/// The max of `logits` and `ln Σ exp(l - max)` (the sum in f64 of f32 `exp`s, the log taken
/// in f64 and rounded to f32), as llama-perplexity's `log_softmax` computes them.
fn max_and_log_sum_exp(logits: &[f32]) -> (f32, f32, usize) {
    let (mut max, mut imax) = (logits[0], 0);
    for (i, &l) in logits.iter().enumerate().skip(1) {
        if l > max {
            max = l;
            imax = i;
        }
    }
    let sum: f64 = logits.iter().map(|&l| f64::from((l - max).exp())).sum();
    (max, sum.ln() as f32, imax)
}

/// One row of the base file for `logits` (`n_vocab` values) into `out` ([`row_len`] u16),
/// returning the NLL of token `tok` (f32 arithmetic, as llama-perplexity).
pub fn quantize_log_probs(logits: &[f32], tok: usize, out: &mut [u16]) -> f32 {
    let (max, lse, _) = max_and_log_sum_exp(logits);
    let min = logits
        .iter()
        .copied()
        .fold(logits[0], f32::min)
        .max(max - 16.0);
    let min_log_prob = min - max - lse;
    let scale = (max - min) / 65535.0;
    let (s, m) = (scale.to_le_bytes(), min_log_prob.to_le_bytes());
    out[0] = u16::from_le_bytes([s[0], s[1]]);
    out[1] = u16::from_le_bytes([s[2], s[3]]);
    out[2] = u16::from_le_bytes([m[0], m[1]]);
    out[3] = u16::from_le_bytes([m[2], m[3]]);
    let q = &mut out[4..];
    q.fill(0);
    if scale != 0.0 {
        let inv = 1.0 / scale;
        for (o, &l) in q.iter_mut().zip(logits) {
            *o = if l > min {
                nearest_int(inv * (l - min)) as u16
            } else {
                0
            };
        }
    }
    max + lse - logits[tok]
}

/// `scale` and `min_log_prob` of a row.
fn row_params(row: &[u16]) -> (f32, f32) {
    let f = |a: u16, b: u16| {
        let (a, b) = (a.to_le_bytes(), b.to_le_bytes());
        f32::from_le_bytes([a[0], a[1], b[0], b[1]])
    };
    (f(row[0], row[1]), f(row[2], row[3]))
}

/// The header of a base file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BaseHeader {
    /// The chunk size the base was evaluated with.
    pub n_ctx: usize,
    /// The base model's vocabulary size.
    pub n_vocab: usize,
    /// Chunks in the file.
    pub n_chunk: usize,
    /// The text's tokens, `n_chunk · n_ctx` of them.
    pub tokens: Vec<u32>,
}

impl BaseHeader {
    /// Bytes of the whole file.
    fn file_bytes(&self) -> u64 {
        20 + 4 * self.tokens.len() as u64
            + (self.n_chunk * scored_per_chunk(self.n_ctx) * row_len(self.n_vocab) * 2) as u64
    }
}

/// Writes a base file atomically: to a new file beside the path ([`ir::gguf::create_beside`]),
/// renamed over it by [`BaseWriter::finish`]; dropped unfinished, it leaves nothing.
pub struct BaseWriter {
    out: Option<BufWriter<std::fs::File>>,
    tmp: PathBuf,
    path: PathBuf,
    n_vocab: usize,
    row: Vec<u16>,
    bytes: Vec<u8>,
}

impl BaseWriter {
    /// Starts `path` with `header`'s fields.
    ///
    /// # Errors
    /// I/O errors naming the file; sizes that do not fit the format's 32-bit fields.
    pub fn create(path: &Path, header: &BaseHeader) -> anyhow::Result<BaseWriter> {
        let n_ctx = u32::try_from(header.n_ctx).context("n_ctx does not fit u32")?;
        let n_vocab = i32::try_from(header.n_vocab).context("n_vocab does not fit i32")?;
        let n_chunk = i32::try_from(header.n_chunk).context("n_chunk does not fit i32")?;
        let (f, tmp, dest) = ir::gguf::create_beside(path)
            .with_context(|| format!("cannot create a file beside '{}'", path.display()))?;
        let mut w = BaseWriter {
            out: Some(BufWriter::with_capacity(1 << 20, f)),
            tmp,
            path: dest,
            n_vocab: header.n_vocab,
            row: vec![0; row_len(header.n_vocab)],
            bytes: Vec::new(),
        };
        let mut head = Vec::with_capacity(20 + 4 * header.tokens.len());
        head.extend_from_slice(MAGIC);
        head.extend_from_slice(&n_ctx.to_le_bytes());
        head.extend_from_slice(&n_vocab.to_le_bytes());
        head.extend_from_slice(&n_chunk.to_le_bytes());
        for &t in &header.tokens {
            head.extend_from_slice(&(t as i32).to_le_bytes());
        }
        w.write(&head)?;
        Ok(w)
    }

    fn write(&mut self, bytes: &[u8]) -> anyhow::Result<()> {
        let path = &self.path;
        self.out
            .as_mut()
            .context("the file is finished")?
            .write_all(bytes)
            .with_context(|| format!("writing '{}'", path.display()))
    }

    /// Appends one scored token: the row of `logits` (`n_vocab` values) whose next token is
    /// `tok`. Returns its NLL.
    ///
    /// # Errors
    /// I/O errors naming the file.
    pub fn push(&mut self, logits: &[f32], tok: usize) -> anyhow::Result<f32> {
        let nll = quantize_log_probs(&logits[..self.n_vocab], tok, &mut self.row);
        let mut bytes = std::mem::take(&mut self.bytes);
        bytes.clear();
        bytes.extend(self.row.iter().flat_map(|v| v.to_le_bytes()));
        let r = self.write(&bytes);
        self.bytes = bytes;
        r.map(|()| nll)
    }

    /// Flushes the file to disk and renames it over the path.
    ///
    /// # Errors
    /// I/O errors naming the file.
    pub fn finish(mut self) -> anyhow::Result<()> {
        let path = self.path.clone();
        let io = |e: std::io::Error| anyhow::anyhow!("writing '{}': {e}", path.display());
        let w = self.out.take().context("the file is finished")?;
        let f = w.into_inner().map_err(|e| io(e.into_error()))?;
        f.sync_all().map_err(io)?;
        std::fs::rename(&self.tmp, &self.path).map_err(io)
    }
}

impl Drop for BaseWriter {
    fn drop(&mut self) {
        if self.out.is_some() {
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}

/// Reads a base file chunk by chunk (one chunk's rows in memory at a time).
pub struct BaseReader {
    input: BufReader<std::fs::File>,
    /// The header.
    pub header: BaseHeader,
    bytes: Vec<u8>,
}

impl BaseReader {
    /// Opens `path` and reads its header, checking the file is as long as the header says.
    ///
    /// # Errors
    /// A missing file, a wrong magic, sizes out of range (`n_ctx` below 8, a vocabulary or
    /// chunk count not above 0), a token id outside the vocabulary, or a file shorter than
    /// its header promises — each naming the file.
    pub fn open(path: &Path) -> anyhow::Result<BaseReader> {
        let name = path.display();
        let f = std::fs::File::open(path).with_context(|| format!("cannot open '{name}'"))?;
        let len = f.metadata().with_context(|| format!("'{name}'"))?.len();
        let mut input = BufReader::with_capacity(1 << 20, f);
        let mut head = [0u8; 20];
        input
            .read_exact(&mut head)
            .with_context(|| format!("'{name}' is too short for a log-probabilities file"))?;
        if &head[..8] != MAGIC {
            bail!("'{name}' does not look like a file of log-probabilities (no _logits_ magic)");
        }
        let word = |i: usize| [head[i], head[i + 1], head[i + 2], head[i + 3]];
        let n_ctx = u32::from_le_bytes(word(8)) as usize;
        let n_vocab = i32::from_le_bytes(word(12));
        let n_chunk = i32::from_le_bytes(word(16));
        if n_ctx < 8 || n_vocab <= 0 || n_chunk <= 0 {
            bail!("'{name}': bad header (n_ctx {n_ctx}, n_vocab {n_vocab}, n_chunk {n_chunk})");
        }
        let (n_vocab, n_chunk) = (n_vocab as usize, n_chunk as usize);
        let n_tokens = (n_ctx as u64) * (n_chunk as u64);
        let mut header = BaseHeader {
            n_ctx,
            n_vocab,
            n_chunk,
            tokens: Vec::new(),
        };
        let need = 20u64
            .checked_add(4 * n_tokens)
            .and_then(|h| {
                h.checked_add(
                    (n_chunk as u64)
                        .checked_mul(scored_per_chunk(n_ctx) as u64)?
                        .checked_mul(row_len(n_vocab) as u64 * 2)?,
                )
            })
            .unwrap_or(u64::MAX);
        if len < need {
            bail!("'{name}' is {len} bytes; its header (n_ctx {n_ctx}, n_vocab {n_vocab}, n_chunk {n_chunk}) needs {need}");
        }
        let mut raw = vec![0u8; 4 * n_tokens as usize];
        input
            .read_exact(&mut raw)
            .with_context(|| format!("reading the tokens of '{name}'"))?;
        header.tokens = raw
            .chunks_exact(4)
            .map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .map(|t| u32::try_from(t).ok().filter(|&t| (t as usize) < n_vocab))
            .collect::<Option<Vec<u32>>>()
            .with_context(|| format!("'{name}' holds a token id outside its vocabulary"))?;
        debug_assert_eq!(header.file_bytes(), need);
        Ok(BaseReader {
            input,
            header,
            bytes: Vec::new(),
        })
    }

    /// The rows of the next chunk into `rows` ([`scored_per_chunk`] × [`row_len`] u16).
    ///
    /// # Errors
    /// A read error (the length was checked at open).
    pub fn next_chunk(&mut self, rows: &mut Vec<u16>) -> anyhow::Result<()> {
        let n = scored_per_chunk(self.header.n_ctx) * row_len(self.header.n_vocab);
        self.bytes.resize(2 * n, 0);
        self.input
            .read_exact(&mut self.bytes)
            .context("reading the base log-probabilities")?;
        rows.clear();
        rows.extend(
            self.bytes
                .chunks_exact(2)
                .map(|b| u16::from_le_bytes([b[0], b[1]])),
        );
        Ok(())
    }
}

/// Running sums of llama-perplexity's `kl_divergence_result`, and every token's KLD and Δp
/// for the percentiles.
#[derive(Clone, Debug, Default)]
pub struct Kld {
    sum_nll: f64,
    sum_nll2: f64,
    sum_nll_base: f64,
    sum_nll_base2: f64,
    sum_nll_nll_base: f64,
    sum_kld: f64,
    sum_kld2: f64,
    sum_p_diff: f64,
    sum_p_diff2: f64,
    sum_p_diff4: f64,
    max_p_diff: f32,
    n_same_top: usize,
    /// KL divergence of each scored token, in order.
    pub kld_values: Vec<f32>,
    /// Δp of each scored token, in order.
    pub p_diff_values: Vec<f32>,
}

/// Mean and its standard error (0 for 10 values or fewer), as llama-perplexity's
/// `mean_and_uncertainty`.
fn mean_and_uncertainty(sum: f64, sum2: f64, count: usize) -> (f64, f64) {
    if count < 1 {
        return (0.0, 0.0);
    }
    let f = sum / count as f64;
    let df = sum2 / count as f64 - f * f;
    let df = if df > 0.0 && count > 10 {
        (df / (count - 1) as f64).sqrt()
    } else {
        0.0
    };
    (f, df)
}

/// Covariance of the means (0 below 10 values), as llama-perplexity's `covariance`.
fn covariance(suma: f64, sumb: f64, sumab: f64, count: usize) -> f64 {
    if count < 10 {
        return 0.0;
    }
    let n = count as f64;
    (sumab / n - (suma / n) * (sumb / n)) / (n - 1.0)
}

/// Percentile `fraction` of sorted `values`, interpolated as llama-perplexity does.
fn percentile(values: &[f32], fraction: f32) -> f32 {
    if fraction <= 0.0 {
        return values[0];
    }
    if fraction >= 1.0 {
        return values[values.len() - 1];
    }
    let p = fraction * (values.len() - 1) as f32;
    let ip = p as usize;
    let p = p - ip as f32;
    (1.0 - p) * values[ip] + p * values[(ip + 1).min(values.len() - 1)]
}

/// The median of sorted `values`.
fn median(v: &[f32]) -> f32 {
    let n = v.len();
    if n.is_multiple_of(2) {
        0.5 * (v[n / 2] + v[n / 2 - 1])
    } else {
        v[n / 2]
    }
}

/// The maximum, the percentiles `fractions` above ½ (descending), the median, those below
/// ½ and the minimum of sorted `v`, one line each as llama-perplexity labels them
/// (`99.9%   KLD: …`), each value through `value` and followed by `unit`.
fn distribution(
    v: &[f32],
    what: &str,
    fractions: &[f32],
    value: impl Fn(f32) -> String,
    unit: &str,
) -> Vec<String> {
    let pct = |q: f32| {
        format!(
            "{:4.1}%   {what}: {}{unit}",
            100.0 * q,
            value(percentile(v, q))
        )
    };
    let mut out = vec![format!("Maximum {what}: {}{unit}", value(v[v.len() - 1]))];
    out.extend(fractions.iter().filter(|&&q| q > 0.5).map(|&q| pct(q)));
    out.push(format!("Median  {what}: {}{unit}", value(median(v))));
    out.extend(fractions.iter().filter(|&&q| q < 0.5).map(|&q| pct(q)));
    out.push(format!("Minimum {what}: {}{unit}", value(v[0])));
    out
}

/// `x` as C's `%W.Plf` prints it (`nan` / `inf` rather than Rust's `NaN`).
fn c(x: f64, w: usize, p: usize) -> String {
    if x.is_nan() {
        format!("{:>w$}", if x.is_sign_negative() { "-nan" } else { "nan" })
    } else if x.is_infinite() {
        format!("{:>w$}", if x < 0.0 { "-inf" } else { "inf" })
    } else {
        format!("{x:w$.p$}")
    }
}

impl Kld {
    /// Scored tokens so far.
    pub fn count(&self) -> usize {
        self.kld_values.len()
    }

    /// Adds one scored token: the model's `logits` (`n_vocab`), the base's `row`
    /// ([`row_len`]) and the actual next token `tok`.
    pub fn add(&mut self, logits: &[f32], row: &[u16], tok: usize) {
        let (max, lse, imax) = max_and_log_sum_exp(logits);
        let (scale, min_log_prob) = row_params(row);
        let base = &row[4..];
        let nll = max + lse - logits[tok];
        self.sum_nll += f64::from(nll);
        self.sum_nll2 += f64::from(nll * nll);
        let nll_base = -(scale * f32::from(base[tok]) + min_log_prob);
        self.sum_nll_base += f64::from(nll_base);
        self.sum_nll_base2 += f64::from(nll_base * nll_base);
        self.sum_nll_nll_base += f64::from(nll * nll_base);
        let log_z = max + lse;
        let (mut sum, mut imax_base, mut best) = (0f64, 0usize, 0f32);
        for (i, (&q, &l)) in base.iter().zip(logits).enumerate() {
            let p_log_base = scale * f32::from(q) + min_log_prob;
            if i == 0 || p_log_base > best {
                best = p_log_base;
                imax_base = i;
            }
            if p_log_base > -16.0 {
                sum += f64::from(p_log_base.exp() * (p_log_base - l + log_z));
            }
        }
        self.sum_kld += sum;
        self.sum_kld2 += sum * sum;
        if imax == imax_base {
            self.n_same_top += 1;
        }
        let p_diff = (-nll).exp() - (-nll_base).exp();
        self.sum_p_diff += f64::from(p_diff);
        let p_diff2 = f64::from(p_diff * p_diff);
        self.sum_p_diff2 += p_diff2;
        self.sum_p_diff4 += p_diff2 * p_diff2;
        self.max_p_diff = self.max_p_diff.max(p_diff.abs());
        self.kld_values.push(sum as f32);
        self.p_diff_values.push(p_diff);
    }

    /// Mean KL divergence and its uncertainty.
    pub fn mean_kld(&self) -> (f64, f64) {
        mean_and_uncertainty(self.sum_kld, self.sum_kld2, self.count())
    }

    /// The share of tokens whose most likely next token is the same in both (0..=1).
    pub fn same_top(&self) -> f64 {
        self.n_same_top as f64 / self.count().max(1) as f64
    }

    /// `(ln PPL(Q), ±)`, `(ln PPL(base), ±)`, their covariance.
    fn log_ppls(&self) -> ((f64, f64), (f64, f64), f64) {
        let n = self.count();
        (
            mean_and_uncertainty(self.sum_nll, self.sum_nll2, n),
            mean_and_uncertainty(self.sum_nll_base, self.sum_nll_base2, n),
            covariance(self.sum_nll, self.sum_nll_base, self.sum_nll_nll_base, n),
        )
    }

    /// RMS of Δp and its uncertainty.
    fn p_diff_rms(&self) -> (f64, f64) {
        let mse = mean_and_uncertainty(self.sum_p_diff2, self.sum_p_diff4, self.count());
        let rms = mse.0.sqrt();
        (rms, 0.5 / rms * mse.1)
    }

    /// The column titles of [`Kld::chunk_line`].
    pub const CHUNK_HEADER: &'static str = "chunk             PPL               ln(PPL(Q)/PPL(base))          KL Divergence              Δp RMS            Same top p";

    /// llama-perplexity's running line after chunk `i` (1-based).
    pub fn chunk_line(&self, i: usize) -> String {
        let (lp, lpb, cov) = self.log_ppls();
        let ppl = lp.0.exp();
        let ratio_unc = (lp.1 * lp.1 + lpb.1 * lpb.1 - 2.0 * cov).sqrt();
        let kl = self.mean_kld();
        let rms = self.p_diff_rms();
        let top = self.same_top();
        let top_unc = (top * (1.0 - top) / (self.count() as f64 - 1.0)).sqrt();
        format!(
            "{i:4}    {} ± {}    {} ± {}    {} ± {}    {} ± {} %    {} ± {} %",
            c(ppl, 9, 4),
            c(ppl * lp.1, 9, 4),
            c(lp.0 - lpb.0, 10, 5),
            c(ratio_unc, 10, 5),
            c(kl.0, 10, 5),
            c(kl.1, 10, 5),
            c(100.0 * rms.0, 6, 3),
            c(100.0 * rms.1, 6, 3),
            c(100.0 * top, 6, 3),
            c(100.0 * top_unc, 6, 3),
        )
    }

    /// llama-perplexity's final statistics (perplexity, KL divergence, token probability),
    /// or `None` under 100 scored tokens (it prints none then either).
    pub fn summary(&self) -> Option<String> {
        let n = self.count();
        if n < 100 {
            return None;
        }
        let mut kld = self.kld_values.clone();
        let mut pd = self.p_diff_values.clone();
        kld.sort_by(f32::total_cmp);
        pd.sort_by(f32::total_cmp);
        let (lp, lpb, cov) = self.log_ppls();
        let (ppl, ppl_base) = (lp.0.exp(), lpb.0.exp());
        let (ppl_unc, ppl_base_unc) = (ppl * lp.1, ppl_base * lpb.1);
        let ratio = (
            lp.0 - lpb.0,
            (lp.1 * lp.1 + lpb.1 * lpb.1 - 2.0 * cov).sqrt(),
        );
        let mut s = String::new();
        let mut line = |l: String| {
            s.push_str(&l);
            s.push('\n');
        };
        line("====== Perplexity statistics ======".into());
        line(format!(
            "Mean PPL(Q)                   : {} ± {}",
            c(ppl, 10, 6),
            c(ppl_unc, 10, 6)
        ));
        line(format!(
            "Mean PPL(base)                : {} ± {}",
            c(ppl_base, 10, 6),
            c(ppl_base_unc, 10, 6)
        ));
        line(format!(
            "Cor(ln(PPL(Q)), ln(PPL(base))): {}%",
            c(100.0 * cov / (lp.1 * lpb.1), 6, 2)
        ));
        line(format!(
            "Mean ln(PPL(Q)/PPL(base))     : {} ± {}",
            c(ratio.0, 10, 6),
            c(ratio.1, 10, 6)
        ));
        let r = ratio.0.exp();
        line(format!(
            "Mean PPL(Q)/PPL(base)         : {} ± {}",
            c(r, 10, 6),
            c(r * ratio.1, 10, 6)
        ));
        let ppl_cov = ppl * ppl_base * cov;
        let diff_unc = (ppl_unc * ppl_unc + ppl_base_unc * ppl_base_unc - 2.0 * ppl_cov).sqrt();
        line(format!(
            "Mean PPL(Q)-PPL(base)         : {} ± {}",
            c(ppl - ppl_base, 10, 6),
            c(diff_unc, 10, 6)
        ));
        line(String::new());
        line("====== KL divergence statistics ======".into());
        let kl = self.mean_kld();
        line(format!(
            "Mean    KLD: {} ± {}",
            c(kl.0, 10, 6),
            c(kl.1, 10, 6)
        ));
        let f = |x: f32| c(f64::from(x), 10, 6);
        for l in distribution(
            &kld,
            "KLD",
            &[0.999, 0.99, 0.95, 0.9, 0.1, 0.05, 0.01, 0.001],
            f,
            "",
        ) {
            line(l);
        }
        line(String::new());
        line("====== Token probability statistics ======".into());
        let pdm = mean_and_uncertainty(self.sum_p_diff, self.sum_p_diff2, n);
        line(format!(
            "Mean    Δp: {} ± {} %",
            c(100.0 * pdm.0, 6, 3),
            c(100.0 * pdm.1, 5, 3)
        ));
        let g = |x: f32| c(100.0 * f64::from(x), 6, 3);
        let fractions = [0.999, 0.99, 0.95, 0.9, 0.75, 0.25, 0.1, 0.05, 0.01, 0.001];
        for l in distribution(&pd, "Δp", &fractions, g, "%") {
            line(l);
        }
        let rms = self.p_diff_rms();
        line(format!(
            "RMS Δp    : {} ± {} %",
            c(100.0 * rms.0, 6, 3),
            c(100.0 * rms.1, 5, 3)
        ));
        let top = self.same_top();
        let top_unc = (top * (1.0 - top) / (n as f64 - 1.0)).sqrt();
        line(format!(
            "Same top p: {} ± {} %",
            c(100.0 * top, 6, 3),
            c(100.0 * top_unc, 5, 3)
        ));
        Some(s)
    }
}

/// Evaluates `engine` on the base file's tokens (its chunks of its `n_ctx`, first token
/// replaced by `bos` when given, at most `n_batch` tokens per decode call) and accumulates
/// [`Kld`] against its rows, calling `chunk_done(i, &kld)` after chunk `i` (0-based).
///
/// # Errors
/// A vocabulary size other than the file's, an engine context below its `n_ctx`, a read
/// or engine error.
pub fn kl_divergence(
    engine: &mut crate::session::Session<'_>,
    base: &mut BaseReader,
    n_batch: usize,
    bos: Option<u32>,
    mut chunk_done: impl FnMut(usize, &Kld),
) -> anyhow::Result<Kld> {
    let h = base.header.clone();
    anyhow::ensure!(
        h.n_vocab == engine.n_vocab(),
        "the base log-probabilities are of a vocabulary of {} tokens; this model has {}",
        h.n_vocab,
        engine.n_vocab()
    );
    anyhow::ensure!(
        engine.n_ctx() >= h.n_ctx,
        "the base was computed with a context of {}; this engine's is {}",
        h.n_ctx,
        engine.n_ctx()
    );
    let (n_ctx, n_vocab, first) = (h.n_ctx, h.n_vocab, h.n_ctx / 2);
    let nv = row_len(n_vocab);
    let mut kld = Kld::default();
    let mut rows = Vec::new();
    crate::perplexity::eval_chunks(
        engine,
        &h.tokens,
        n_ctx,
        n_batch,
        h.n_chunk,
        bos,
        |chunk, logits| {
            base.next_chunk(&mut rows)?;
            for (k, i) in (first..n_ctx - 1).enumerate() {
                let tok = h.tokens[chunk * n_ctx + i + 1] as usize;
                kld.add(
                    &logits[i * n_vocab..(i + 1) * n_vocab],
                    &rows[k * nv..(k + 1) * nv],
                    tok,
                );
            }
            chunk_done(chunk, &kld);
            Ok(())
        },
    )?;
    Ok(kld)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        std::env::temp_dir().join(format!("modelc-kld-{name}-{}", std::process::id()))
    }

    #[test]
    fn base_file_round_trip() {
        let path = scratch("roundtrip");
        let (n_ctx, n_vocab, n_chunk) = (8, 5, 2);
        let header = BaseHeader {
            n_ctx,
            n_vocab,
            n_chunk,
            tokens: (0..16).map(|i| i % 5).collect(),
        };
        let rows: Vec<Vec<f32>> = (0..n_chunk * scored_per_chunk(n_ctx))
            .map(|r| {
                (0..n_vocab)
                    .map(|i| (r * 7 + i * 3) as f32 * 0.37 - 2.0)
                    .collect()
            })
            .collect();
        let mut w = BaseWriter::create(&path, &header).unwrap();
        for r in &rows {
            w.push(r, 1).unwrap();
        }
        w.finish().unwrap();
        let len = std::fs::metadata(&path).unwrap().len();
        assert_eq!(len, header.file_bytes());
        assert_eq!(len, 20 + 4 * 16 + 2 * 3 * 10 * 2);
        let mut r = BaseReader::open(&path).unwrap();
        assert_eq!(r.header, header);
        let mut got = Vec::new();
        for chunk in 0..n_chunk {
            r.next_chunk(&mut got).unwrap();
            for (k, row) in got.chunks_exact(row_len(n_vocab)).enumerate() {
                let logits = &rows[chunk * 3 + k];
                let mut want = vec![0u16; row_len(n_vocab)];
                quantize_log_probs(logits, 0, &mut want);
                assert_eq!(row, &want[..]);
                // Each value decodes to its log-probability within half a step.
                let (scale, min_lp) = row_params(row);
                let (max, lse, _) = max_and_log_sum_exp(logits);
                for (i, &l) in logits.iter().enumerate() {
                    let lp = l - max - lse;
                    if lp > min_lp {
                        let back = scale * f32::from(row[4 + i]) + min_lp;
                        assert!((back - lp).abs() <= scale * 0.51, "{back} vs {lp}");
                    }
                }
            }
        }
        // A truncated file is refused at open, naming the size.
        let bytes = std::fs::read(&path).unwrap();
        std::fs::write(&path, &bytes[..bytes.len() - 1]).unwrap();
        let e = BaseReader::open(&path).err().unwrap().to_string();
        assert!(e.contains("needs"), "{e}");
        std::fs::write(&path, b"_logits?").unwrap();
        assert!(BaseReader::open(&path).is_err());
        let _ = std::fs::remove_file(&path);
    }

    #[test]
    fn statistics_with_known_answers() {
        // Against itself: KLD ≈ 0 (the base is stored in steps of 16/65535 nats: ~1e-5), the same top
        // token everywhere, Δp ≈ 0.
        let n_vocab = 50;
        let mut same = Kld::default();
        for t in 0..120usize {
            let logits: Vec<f32> = (0..n_vocab)
                .map(|i| ((i * 31 + t * 17) % 23) as f32 * 0.4)
                .collect();
            let mut row = vec![0u16; row_len(n_vocab)];
            let nll = quantize_log_probs(&logits, t % n_vocab, &mut row);
            assert!(nll > 0.0);
            same.add(&logits, &row, t % n_vocab);
        }
        assert!(same.mean_kld().0.abs() < 5e-5, "{:?}", same.mean_kld());
        assert_eq!(same.same_top(), 1.0);
        let s = same.summary().unwrap();
        assert!(s.contains("Same top p: 100.000 ± 0.000 %"), "{s}");
        // Base p = (1/2, 1/2), model q = (3/4, 1/4): KL(p‖q) = ½·ln(4/3); the actual next
        // token 1 has Δp = 1/4 − 1/2.
        let base = [0.0, 0.0, -100.0, -100.0];
        let model = [3f32.ln(), 0.0, -100.0, -100.0];
        let mut row = vec![0u16; row_len(4)];
        quantize_log_probs(&base, 1, &mut row);
        let mut k = Kld::default();
        k.add(&model, &row, 1);
        let want = 0.5 * (4.0f64 / 3.0).ln();
        assert!((k.mean_kld().0 - want).abs() < 1e-4, "{:?}", k.mean_kld());
        assert!((k.p_diff_values[0] + 0.25).abs() < 1e-4);
        assert_eq!(k.same_top(), 1.0, "a tie goes to the first token in both");
        assert!(k.summary().is_none(), "no statistics under 100 tokens");
    }
}
