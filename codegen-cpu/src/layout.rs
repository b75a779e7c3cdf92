//! The weight layout the CPU matmul kernels read, and the repack step (done once, at load
//! time) from GGML's row-major blocks into it.
//!
//! A weight `{K, M}` (M rows of K values) is cut into groups of [`GROUP_ROWS`] = 4 rows; the
//! last group is padded with zero rows when `M % 4 != 0`. Groups are stored one after another,
//! each as its `K/32` blocks in order; one *group-block* holds block `b` of the 4 rows,
//! interleaved so that one 32-bit SIMD lane holds one row (measured on this project's machine:
//! this layout with the activation block broadcast reached parity with llama.cpp's 256-bit
//! repacked kernels at decode, see issue 5, when the kernels still summed in ggml's scalar
//! order):
//!
//! | bytes | quantized group-block |
//! |-------|-----------------------|
//! | 0..8  | `d` of rows 0..3, f16 as in the file |
//! | 8..16 | Q4_1 only: `m` of rows 0..3, f16 |
//! | then  | quants in 16-byte chunks; chunk `c` holds bytes `4c..4c+4` of row 0, then of row 1, 2, 3 |
//!
//! The scales stay f16 (the kernels convert 4 at a time with integer instructions, exactly):
//! storing them as f32 would make Q4_1 weights 20% larger, and decode reads every weight
//! byte once per token. The kernels' conversion does not produce infinities or NaNs, so
//! [`repack`] rejects weights with non-finite scales (llama.cpp's `ggml_validate_row_data`
//! rejects them too, when asked to check tensors).
//!
//! For 4-bit formats byte `j` keeps ggml's packing (value `j` in the low nibble, `j + 16` in
//! the high one), so chunk `c` holds values `4c..4c+4` (low nibbles) and `16+4c..16+4c+4`
//! (high nibbles) of each row. For Q8_0, chunk `c` holds values `4c..4c+4`. So each chunk
//! holds whole lanes of llama.cpp's x86 AVX2 dot products (lane `l` = the products of values
//! `4l..4l+4` of a block): lanes `c` and `4 + c` for 4-bit formats, lane `c` for Q8_0, which
//! is what lets the kernels sum in that order (see `generated::quant`).
//!
//! Float weights (F32, F16, BF16) keep their type; one group is `K` vectors of the 4 rows'
//! values at that `k` (16 bytes for F32, 8 for F16 and BF16, converted to f32 in the kernel,
//! exactly). F16 weights must be finite, for the same reason as the scales above.

use half::{bf16, f16};
use ir::ggml::GgmlType;

use crate::formats::{QuantFormat, GROUP_ROWS, QK};
use crate::jit::{CodegenError, Result};

/// A byte buffer aligned to 64 bytes (one cache line), so that every 16-byte chunk of a
/// repacked weight is aligned.
pub struct AlignedBuf {
    words: Vec<[u64; 8]>,
    len: usize,
}

impl AlignedBuf {
    /// `len` zero bytes.
    pub fn zeroed(len: usize) -> AlignedBuf {
        AlignedBuf {
            words: vec![[0u64; 8]; len.div_ceil(64)],
            len,
        }
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `words` owns at least `len` initialized bytes (`[u64; 8]` has no padding),
        // and u8 has no alignment requirement.
        unsafe { std::slice::from_raw_parts(self.words.as_ptr().cast::<u8>(), self.len) }
    }

    /// The bytes, mutable.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_slice`, and `&mut self` makes the borrow unique.
        unsafe { std::slice::from_raw_parts_mut(self.words.as_mut_ptr().cast::<u8>(), self.len) }
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl std::fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AlignedBuf({} bytes)", self.len)
    }
}

/// A weight `{k, m}` repacked into the kernels' layout (see the module doc).
#[derive(Debug)]
pub struct RepackedWeight {
    wtype: GgmlType,
    k: usize,
    m: usize,
    data: AlignedBuf,
}

impl RepackedWeight {
    /// The GGML type of the source weight.
    pub fn wtype(&self) -> GgmlType {
        self.wtype
    }
    /// Values per row (`ne[0]`).
    pub fn k(&self) -> usize {
        self.k
    }
    /// Rows (`ne[1]`).
    pub fn m(&self) -> usize {
        self.m
    }
    /// Number of 4-row groups, the last one possibly padded.
    pub fn groups(&self) -> usize {
        self.m.div_ceil(GROUP_ROWS)
    }
    /// Bytes of one group.
    pub fn group_bytes(&self) -> usize {
        group_bytes(self.wtype, self.k)
    }
    /// The repacked bytes.
    pub fn data(&self) -> &[u8] {
        self.data.as_slice()
    }
    /// Bytes a kernel reads per call over all rows (the repacked size).
    pub fn bytes(&self) -> usize {
        self.data.len()
    }
}

/// Bytes of one repacked group of 4 rows of `k` values of type `wtype` (for a `k` that
/// passed [`repack`] or `MatmulSpec::validate`).
pub(crate) fn group_bytes(wtype: GgmlType, k: usize) -> usize {
    group_bytes_checked(wtype, k).unwrap_or(usize::MAX)
}

/// [`group_bytes`], `None` on overflow.
pub(crate) fn group_bytes_checked(wtype: GgmlType, k: usize) -> Option<usize> {
    match QuantFormat::of(wtype) {
        Some(fmt) => (k / QK).checked_mul(fmt.group_block_bytes()),
        None => k.checked_mul(wtype.type_size() * GROUP_ROWS),
    }
}

/// Whether [`repack`] handles `wtype`.
pub fn supports(wtype: GgmlType) -> bool {
    QuantFormat::of(wtype).is_some()
        || matches!(wtype, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16)
}

/// Repacks the GGML tensor data `src` of a weight `{k, m}` of type `wtype` (`m` rows of
/// `ggml_row_size(wtype, k)` bytes) into the kernels' layout.
///
/// Errors: [`CodegenError::UnsupportedType`] for types without a kernel;
/// [`CodegenError::Shape`] when `k` is not a multiple of the block size or the size
/// overflows; [`CodegenError::BufferSize`] when `src` is not exactly `m` rows.
pub fn repack(wtype: GgmlType, k: usize, m: usize, src: &[u8]) -> Result<RepackedWeight> {
    if !supports(wtype) {
        return Err(CodegenError::UnsupportedType(wtype.name()));
    }
    let row_bytes = wtype
        .row_size(k as u64)
        .and_then(|r| usize::try_from(r).ok())
        .ok_or_else(|| {
            CodegenError::Shape(format!(
                "{} row of {k} values is not a whole number of blocks",
                wtype.name()
            ))
        })?;
    if QuantFormat::of(wtype).is_some() && !k.is_multiple_of(QK) {
        return Err(CodegenError::Shape(format!(
            "k = {k} is not a multiple of {QK}"
        )));
    }
    let expected = row_bytes
        .checked_mul(m)
        .ok_or_else(|| CodegenError::Shape(format!("{m} rows of {row_bytes} bytes overflow")))?;
    if src.len() != expected {
        return Err(CodegenError::BufferSize {
            what: "weight tensor data",
            expected,
            got: src.len(),
        });
    }
    let groups = m.div_ceil(GROUP_ROWS);
    let overflow = || CodegenError::Shape(format!("repacked size of {m} x {k} overflows"));
    let gb = group_bytes_checked(wtype, k).ok_or_else(overflow)?;
    let total = gb.checked_mul(groups).ok_or_else(overflow)?;
    let mut data = AlignedBuf::zeroed(total);
    let dst = data.as_mut_slice();
    for row in 0..m {
        let src_row = &src[row * row_bytes..(row + 1) * row_bytes];
        let group = &mut dst[(row / GROUP_ROWS) * gb..(row / GROUP_ROWS + 1) * gb];
        let lane = row % GROUP_ROWS;
        match QuantFormat::of(wtype) {
            Some(fmt) => {
                check_scales(&fmt, src_row, row)?;
                repack_quant_row(&fmt, src_row, group, lane)
            }
            None => repack_float_row(wtype, src_row, group, lane, row)?,
        }
    }
    Ok(RepackedWeight { wtype, k, m, data })
}

/// Checks that every f16 scale (`d`, and `m` for Q4_1) of a source row is finite.
///
/// Errors: [`CodegenError::NonFiniteScale`] naming the row and block.
fn check_scales(fmt: &QuantFormat, src_row: &[u8], row: usize) -> Result<()> {
    let n_scales = if fmt.has_min { 2 } else { 1 };
    for (b, blk) in src_row.chunks_exact(fmt.src_block_bytes()).enumerate() {
        for i in 0..n_scales {
            let bits = u16::from_le_bytes([blk[2 * i], blk[2 * i + 1]]);
            if bits & 0x7c00 == 0x7c00 {
                return Err(CodegenError::NonFiniteScale {
                    row,
                    block: b,
                    field: if i == 0 { "d" } else { "m" },
                });
            }
        }
    }
    Ok(())
}

/// Writes one row (`lane` of its group) of a quantized weight into its group's bytes.
fn repack_quant_row(fmt: &QuantFormat, src_row: &[u8], group: &mut [u8], lane: usize) {
    let sb = fmt.src_block_bytes();
    let gbb = fmt.group_block_bytes();
    let qs_src = fmt.src_qs_offset();
    let qs_dst = fmt.group_qs_offset();
    for (b, blk) in src_row.chunks_exact(sb).enumerate() {
        let g = &mut group[b * gbb..(b + 1) * gbb];
        g[2 * lane..2 * lane + 2].copy_from_slice(&blk[0..2]);
        if fmt.has_min {
            g[8 + 2 * lane..8 + 2 * lane + 2].copy_from_slice(&blk[2..4]);
        }
        for c in 0..fmt.qs_bytes() / 4 {
            let at = qs_dst + 16 * c + 4 * lane;
            g[at..at + 4].copy_from_slice(&blk[qs_src + 4 * c..qs_src + 4 * c + 4]);
        }
    }
}

/// Writes one row (`lane` of its group) of a float weight into its group's bytes.
///
/// Errors: [`CodegenError::NonFiniteWeight`] for an infinite or NaN F16 value.
fn repack_float_row(
    wtype: GgmlType,
    src_row: &[u8],
    group: &mut [u8],
    lane: usize,
    row: usize,
) -> Result<()> {
    let es = wtype.type_size();
    for (kk, e) in src_row.chunks_exact(es).enumerate() {
        if wtype == GgmlType::F16 && u16::from_le_bytes([e[0], e[1]]) & 0x7c00 == 0x7c00 {
            return Err(CodegenError::NonFiniteWeight { row, col: kk });
        }
        let at = (kk * GROUP_ROWS + lane) * es;
        group[at..at + es].copy_from_slice(e);
    }
    Ok(())
}

/// Value `kk` of `lane` in a group of a float weight, as f32.
pub(crate) fn float_weight(wtype: GgmlType, group: &[u8], lane: usize, kk: usize) -> f32 {
    let es = wtype.type_size();
    let at = (kk * GROUP_ROWS + lane) * es;
    let e = &group[at..at + es];
    match wtype {
        GgmlType::F16 => f16::from_le_bytes([e[0], e[1]]).to_f32(),
        GgmlType::BF16 => bf16::from_le_bytes([e[0], e[1]]).to_f32(),
        _ => f32::from_le_bytes([e[0], e[1], e[2], e[3]]),
    }
}

/// Reads back row `row` of a repacked weight as f32 values (dequantized: `d·(q - z)` or
/// `d·q + m`), for tests and the scalar fallback.
pub fn dequantize_row(w: &RepackedWeight, row: usize, out: &mut [f32]) -> Result<()> {
    if row >= w.m || out.len() != w.k {
        return Err(CodegenError::Shape(format!(
            "row {row} of {} rows into {} values (k = {})",
            w.m,
            out.len(),
            w.k
        )));
    }
    let gb = w.group_bytes();
    let group = &w.data()[(row / GROUP_ROWS) * gb..(row / GROUP_ROWS + 1) * gb];
    let lane = row % GROUP_ROWS;
    match QuantFormat::of(w.wtype) {
        Some(fmt) => {
            let gbb = fmt.group_block_bytes();
            for (b, ob) in out.chunks_exact_mut(QK).enumerate() {
                let g = &group[b * gbb..(b + 1) * gbb];
                let d = scale_d(g, lane);
                let m = if fmt.has_min { scale_m(g, lane) } else { 0.0 };
                for (j, o) in ob.iter_mut().enumerate() {
                    let q = quant_at(&fmt, g, lane, j);
                    *o = if fmt.has_min {
                        d * q as f32 + m
                    } else {
                        d * (q - fmt.zero_point) as f32
                    };
                }
            }
        }
        None => {
            for (kk, o) in out.iter_mut().enumerate() {
                *o = float_weight(w.wtype, group, lane, kk);
            }
        }
    }
    Ok(())
}

/// `d` of `lane` in a quantized group-block.
pub(crate) fn scale_d(g: &[u8], lane: usize) -> f32 {
    f16::from_le_bytes([g[2 * lane], g[2 * lane + 1]]).to_f32()
}

/// `m` of `lane` in a Q4_1 group-block.
pub(crate) fn scale_m(g: &[u8], lane: usize) -> f32 {
    f16::from_le_bytes([g[8 + 2 * lane], g[8 + 2 * lane + 1]]).to_f32()
}

/// The stored quant of value `j` (0..32) of `lane` in a group-block: unsigned nibble for 4-bit
/// formats, i8 for Q8_0.
pub(crate) fn quant_at(fmt: &QuantFormat, g: &[u8], lane: usize, j: usize) -> i32 {
    let qs = fmt.group_qs_offset();
    if fmt.bits == 4 {
        let (jj, hi) = if j < 16 { (j, false) } else { (j - 16, true) };
        let byte = g[qs + 16 * (jj / 4) + 4 * lane + jj % 4];
        (if hi { byte >> 4 } else { byte & 0x0F }) as i32
    } else {
        g[qs + 16 * (j / 4) + 4 * lane + j % 4] as i8 as i32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn q4_1_round_trip_through_layout() {
        // Two rows are enough to check lanes; m = 6 also checks the padded last group.
        let (k, m) = (64, 6);
        let fmt = QuantFormat::of(GgmlType::Q4_1).unwrap();
        let mut src = vec![0u8; m * k / 32 * 20];
        for (i, b) in src.iter_mut().enumerate() {
            *b = (i * 37 % 251) as u8;
        }
        // sane f16 scales: d = 0.5 + row, m = -1
        for row in 0..m {
            for b in 0..k / 32 {
                let at = (row * (k / 32) + b) * 20;
                src[at..at + 2].copy_from_slice(&f16::from_f32(0.5 + row as f32).to_le_bytes());
                src[at + 2..at + 4].copy_from_slice(&f16::from_f32(-1.0).to_le_bytes());
            }
        }
        let w = repack(GgmlType::Q4_1, k, m, &src).unwrap();
        assert_eq!(w.groups(), 2);
        assert_eq!(w.bytes(), 2 * 2 * fmt.group_block_bytes());
        let mut out = vec![0.0; k];
        for row in 0..m {
            dequantize_row(&w, row, &mut out).unwrap();
            for j in 0..k {
                let blk = &src[(row * (k / 32) + j / 32) * 20..][..20];
                let byte = blk[4 + (j % 32) % 16];
                let q = if j % 32 < 16 { byte & 15 } else { byte >> 4 };
                let want = (0.5 + row as f32) * q as f32 - 1.0;
                assert_eq!(out[j], want, "row {row} j {j}");
            }
        }
    }

    #[test]
    fn rejects_non_finite_scales() {
        let mut src = vec![0u8; 2 * 20];
        src[20..22].copy_from_slice(&f16::from_f32(0.5).to_le_bytes());
        src[22..24].copy_from_slice(&f16::INFINITY.to_le_bytes());
        match repack(GgmlType::Q4_1, 32, 2, &src) {
            Err(CodegenError::NonFiniteScale {
                row: 1,
                block: 0,
                field: "m",
            }) => {}
            other => panic!("expected a non-finite scale error, got {other:?}"),
        }
        src[22..24].copy_from_slice(&f16::from_f32(-0.5).to_le_bytes());
        assert!(repack(GgmlType::Q4_1, 32, 2, &src).is_ok());
    }

    #[test]
    fn float_weights_keep_their_type_and_reject_non_finite_f16() {
        let vals = [1.5f32, -2.25, 0.0, 3e-6, 65504.0, -0.125];
        let src16: Vec<u8> = vals
            .iter()
            .flat_map(|v| f16::from_f32(*v).to_le_bytes())
            .collect();
        let srcb: Vec<u8> = vals
            .iter()
            .flat_map(|v| bf16::from_f32(*v).to_le_bytes())
            .collect();
        for (t, src) in [(GgmlType::F16, &src16), (GgmlType::BF16, &srcb)] {
            let w = repack(t, 3, 2, src).unwrap();
            assert_eq!(
                w.bytes(),
                3 * 4 * 2,
                "{t}: one group of 4 rows x 3 values x 2 bytes"
            );
            let mut row = [0.0f32; 3];
            for r in 0..2 {
                dequantize_row(&w, r, &mut row).unwrap();
                for (j, v) in row.iter().enumerate() {
                    let e = &src[(r * 3 + j) * 2..][..2];
                    let want = if t == GgmlType::F16 {
                        f16::from_le_bytes([e[0], e[1]]).to_f32()
                    } else {
                        bf16::from_le_bytes([e[0], e[1]]).to_f32()
                    };
                    assert_eq!(*v, want);
                }
            }
        }
        let mut bad = src16.clone();
        bad[8..10].copy_from_slice(&f16::NAN.to_le_bytes());
        match repack(GgmlType::F16, 3, 2, &bad) {
            Err(CodegenError::NonFiniteWeight { row: 1, col: 1 }) => {}
            other => panic!("expected a non-finite weight error, got {other:?}"),
        }
    }

    #[test]
    fn rejects_wrong_sizes_and_types() {
        assert!(repack(GgmlType::Q4_1, 64, 2, &[0u8; 79]).is_err());
        assert!(repack(GgmlType::Q4_1, 48, 1, &[0u8; 30]).is_err());
        assert!(repack(GgmlType::Q6_K, 256, 1, &[0u8; 210]).is_err());
    }
}
