//! The read-bandwidth probe the decode kernels are measured against (`bench`'s roofline,
//! `kernel-bench --only bandwidth`): a loop that reads each byte once and does almost
//! nothing else, in every form this host runs ([`StreamRead`]: each vector width it has,
//! one or several interleaved streams), so that the best of them is what a well-written
//! streaming loop reaches here. One plain loop with 128-bit loads read 9.9 GB/s from one
//! Zen 4 core where llama.cpp streams 14.9 (issue 39): a roof measured so flatters the
//! kernels compared with it.

/// The vector width of a probe's loads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Width {
    /// Plain Rust (what the compiler's baseline target vectorizes it to: SSE2 on x86-64,
    /// NEON on aarch64).
    Plain,
    /// 256-bit AVX2 loads.
    Avx2,
    /// 512-bit AVX-512 loads.
    Avx512,
}

/// One form of the probe: its load width and how many parts of the buffer it reads at once
/// (`streams`: the buffer split into that many contiguous parts, each loop step reading the
/// next bytes of every part; some cores' prefetchers follow several streams faster than one).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StreamRead {
    /// The load width.
    pub width: Width,
    /// Interleaved streams (1, 2 or 4).
    pub streams: usize,
}

impl std::fmt::Display for StreamRead {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let w = match self.width {
            Width::Plain => "plain",
            Width::Avx2 => "avx2",
            Width::Avx512 => "avx512",
        };
        write!(f, "{w} × {} streams", self.streams)
    }
}

/// Every form this host runs.
pub fn stream_reads() -> Vec<StreamRead> {
    #[allow(unused_mut)] // x86-64 adds its vector widths
    let mut widths = vec![Width::Plain];
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx2") {
            widths.push(Width::Avx2);
        }
        if std::is_x86_feature_detected!("avx512f") {
            widths.push(Width::Avx512);
        }
    }
    widths
        .into_iter()
        .flat_map(|width| [1, 2, 4].map(|streams| StreamRead { width, streams }))
        .collect()
}

/// Words each stream reads per loop step: two 64-byte cache lines.
const STEP_WORDS: usize = 16;

/// A wrapping sum of `words` read as `how` says (the result only keeps the reads from being
/// optimized away; it depends on the form). A form this host lacks reads in plain Rust.
pub fn stream_sum(words: &[u64], how: StreamRead) -> u64 {
    let streams = how.streams.clamp(1, 4);
    let per = words.len() / streams / STEP_WORDS * STEP_WORDS;
    let parts: Vec<&[u64]> = (0..streams)
        .map(|s| &words[s * per..(s + 1) * per])
        .collect();
    let tail = plain(&[&words[streams * per..]]);
    let body = match how.width {
        #[cfg(target_arch = "x86_64")]
        Width::Avx2 if std::is_x86_feature_detected!("avx2") => {
            // SAFETY: the host has AVX2 (checked); the parts are whole steps long.
            unsafe { x86::avx2(&parts) }
        }
        #[cfg(target_arch = "x86_64")]
        Width::Avx512 if std::is_x86_feature_detected!("avx512f") => {
            // SAFETY: the host has AVX-512F (checked); the parts are whole steps long.
            unsafe { x86::avx512(&parts) }
        }
        _ => plain(&parts),
    };
    body ^ tail
}

/// The plain form: eight independent accumulators per stream (the loop vectorizes).
fn plain(parts: &[&[u64]]) -> u64 {
    let mut acc = [[0u64; 8]; 4];
    let len = parts.iter().map(|p| p.len()).min().unwrap_or(0);
    for i in (0..len / 8 * 8).step_by(8) {
        for (s, p) in parts.iter().enumerate() {
            for j in 0..8 {
                acc[s][j] = acc[s][j].wrapping_add(p[i + j]);
            }
        }
    }
    let rest = parts.iter().flat_map(|p| &p[len / 8 * 8..]);
    acc.iter().flatten().chain(rest).fold(0, |x, y| x ^ y)
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::STEP_WORDS;
    use std::arch::x86_64::*;

    /// # Safety
    /// The host must have AVX2; every part is a whole number of steps, all the same length.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn avx2(parts: &[&[u64]]) -> u64 {
        let mut acc = [_mm256_setzero_si256(); 16];
        let len = parts.iter().map(|p| p.len()).min().unwrap_or(0);
        for i in (0..len).step_by(STEP_WORDS) {
            for (s, p) in parts.iter().enumerate() {
                let at = p.as_ptr().add(i) as *const __m256i;
                for j in 0..4 {
                    acc[4 * s + j] =
                        _mm256_add_epi64(acc[4 * s + j], _mm256_loadu_si256(at.add(j)));
                }
            }
        }
        let mut out = [0u64; 4];
        let mut x = _mm256_setzero_si256();
        for a in acc {
            x = _mm256_xor_si256(x, a);
        }
        _mm256_storeu_si256(out.as_mut_ptr() as *mut __m256i, x);
        out.iter().fold(0, |a, b| a ^ b)
    }

    /// # Safety
    /// The host must have AVX-512F; every part is a whole number of steps, all the same
    /// length.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn avx512(parts: &[&[u64]]) -> u64 {
        let mut acc = [_mm512_setzero_si512(); 8];
        let len = parts.iter().map(|p| p.len()).min().unwrap_or(0);
        for i in (0..len).step_by(STEP_WORDS) {
            for (s, p) in parts.iter().enumerate() {
                let at = p.as_ptr().add(i);
                for j in 0..2 {
                    let v = _mm512_loadu_si512(at.add(8 * j) as *const _);
                    acc[2 * s + j] = _mm512_add_epi64(acc[2 * s + j], v);
                }
            }
        }
        let mut x = _mm512_setzero_si512();
        for a in acc {
            x = _mm512_xor_si512(x, a);
        }
        let mut out = [0u64; 8];
        _mm512_storeu_si512(out.as_mut_ptr() as *mut _, x);
        out.iter().fold(0, |a, b| a ^ b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every form reads every word once: with all words 1 except a marked one, the sums
    /// differ from the plain form's only by where the lanes fold, so check the total through
    /// a buffer whose xor-fold is known: all zero but one word.
    #[test]
    fn every_form_reads_every_word() {
        for len in [0usize, 7, 16, 100, 1000, 4099] {
            for at in [0, len / 2, len.saturating_sub(1)] {
                if at >= len {
                    continue;
                }
                let mut w = vec![0u64; len];
                w[at] = 0x5a5a;
                for how in stream_reads() {
                    assert_eq!(stream_sum(&w, how), 0x5a5a, "{how} len {len} at {at}");
                }
            }
        }
    }
}
