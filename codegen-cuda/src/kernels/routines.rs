//! Device dequantizers of the formats whose decoding no [`ir::ggml::Recipe`] expresses
//! ([`ir::ggml::Decode::Routine`]: lattice grids with sign tables, base-3 digits, an E8M0
//! scale): one hand-written body per type, keyed by [`GgmlType`], each computing value `i`
//! of a block as ggml's `dequantize_row_<type>` (ggml-quants.c) does, in the same f32
//! operation order as `ir`'s reference dequantizer (`ir/src/ggml/dequant.rs`), so that the
//! values are bit-identical.
//!
//! The lookup tables they read (the lattice grids, the sign table, the MXFP4 values) are
//! printed from `ir`'s arrays ([`ir::ggml::grids`]) as `CONSTANT` arrays under ggml's
//! names, once per source and only for the types the source reads
//! ([`super::dequant::print_all`]).
//!
//! Blocks lie at any multiple of their size in a row (66 bytes for IQ2_XXS), so a block is
//! only 2-byte aligned (MXFP4: 1-byte): the bodies read bytes and `u16`s at even offsets,
//! never a wider word.

use ir::ggml::grids::{
    IQ1S_GRID, IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, IQ3S_GRID, IQ3XXS_GRID, KSIGNS_IQ2XS,
    KVALUES_MXFP4,
};
use ir::ggml::GgmlType;
use std::fmt::Write;

/// The entries of a [`Table`], in their C element type.
#[derive(Clone, Copy, Debug)]
pub enum Values {
    /// `u64` entries (the grids of 8 values, byte `j` value `j`).
    U64(&'static [u64]),
    /// `u32` entries (the grids of 4 values).
    U32(&'static [u32]),
    /// `u8` entries.
    U8(&'static [u8]),
    /// `i8` entries.
    I8(&'static [i8]),
}

/// One of ggml's lookup tables, printed as a file-scope `CONSTANT` array.
#[derive(Clone, Copy, Debug)]
pub struct Table {
    /// ggml's name of the table (`iq2xxs_grid`), the array's name in the source.
    pub name: &'static str,
    /// The entries, from `ir`'s copy of the table.
    pub values: Values,
}

impl Table {
    /// Bytes the table takes on the device.
    pub fn bytes(&self) -> usize {
        match self.values {
            Values::U64(v) => 8 * v.len(),
            Values::U32(v) => 4 * v.len(),
            Values::U8(v) => v.len(),
            Values::I8(v) => v.len(),
        }
    }

    /// The table as C: a comment, then `CONSTANT <type> <name>[n] = {...};`, hexadecimal
    /// for the grids (as ggml-common.h writes them), decimal for bytes. (No integer
    /// suffix: a hexadecimal literal takes the first type its value fits, which is 64-bit
    /// for the wide grid entries in every dialect.)
    pub fn print(&self) -> String {
        let (ty, items, per_line): (&str, Vec<String>, usize) = match self.values {
            Values::U64(v) => ("u64", v.iter().map(|x| format!("0x{x:016x}")).collect(), 4),
            Values::U32(v) => ("u32", v.iter().map(|x| format!("0x{x:08x}")).collect(), 8),
            Values::U8(v) => ("u8", v.iter().map(|x| x.to_string()).collect(), 16),
            Values::I8(v) => ("i8", v.iter().map(|x| x.to_string()).collect(), 16),
        };
        let mut s = format!(
            "// ggml's {} (ggml-common.h), {} bytes\nCONSTANT {ty} {}[{}] = {{\n",
            self.name,
            self.bytes(),
            self.name,
            items.len()
        );
        for line in items.chunks(per_line) {
            writeln!(s, "    {},", line.join(", ")).ok();
        }
        s += "};\n";
        s
    }
}

/// `iq2xxs_grid`: 256 entries of 8 magnitudes.
pub static IQ2XXS: Table = Table {
    name: "iq2xxs_grid",
    values: Values::U64(&IQ2XXS_GRID),
};
/// `iq2xs_grid`: 512 entries of 8 magnitudes.
pub static IQ2XS: Table = Table {
    name: "iq2xs_grid",
    values: Values::U64(&IQ2XS_GRID),
};
/// `iq2s_grid`: 1024 entries of 8 magnitudes.
pub static IQ2S: Table = Table {
    name: "iq2s_grid",
    values: Values::U64(&IQ2S_GRID),
};
/// `iq3xxs_grid`: 256 entries of 4 magnitudes.
pub static IQ3XXS: Table = Table {
    name: "iq3xxs_grid",
    values: Values::U32(&IQ3XXS_GRID),
};
/// `iq3s_grid`: 512 entries of 4 magnitudes.
pub static IQ3S: Table = Table {
    name: "iq3s_grid",
    values: Values::U32(&IQ3S_GRID),
};
/// `iq1s_grid`: 2048 entries of 8 values -1, 0, 1 (int8 bytes).
pub static IQ1S: Table = Table {
    name: "iq1s_grid",
    values: Values::U64(&IQ1S_GRID),
};
/// `ksigns_iq2xs`: the sign byte of each 7-bit sign index.
pub static KSIGNS: Table = Table {
    name: "ksigns_iq2xs",
    values: Values::U8(&KSIGNS_IQ2XS),
};
/// `kvalues_mxfp4`: the sixteen E2M1 values, doubled.
pub static MXFP4_VALUES: Table = Table {
    name: "kvalues_mxfp4",
    values: Values::I8(&KVALUES_MXFP4),
};

/// The device dequantizer of one [`ir::ggml::Decode::Routine`] format: the body of
/// `FN float dq_<TYPE>(const GMEM u8* b, i32 i)` (value `i` of the block at `b`).
#[derive(Clone, Copy, Debug)]
pub struct Routine {
    /// The ggml function whose values it reproduces (`dequantize_row_iq2_xxs`).
    pub ggml: &'static str,
    /// The tables the body reads.
    pub tables: &'static [&'static Table],
    /// The function body, in the kernel vocabulary.
    pub body: &'static str,
}

/// The routine of `t`, for the types whose format is a [`ir::ggml::Decode::Routine`];
/// `None` for every other type.
pub fn routine(t: GgmlType) -> Option<&'static Routine> {
    Some(match t {
        GgmlType::IQ2_XXS => &IQ2_XXS,
        GgmlType::IQ2_XS => &IQ2_XS,
        GgmlType::IQ2_S => &IQ2_S,
        GgmlType::IQ3_XXS => &IQ3_XXS,
        GgmlType::IQ3_S => &IQ3_S,
        GgmlType::IQ1_S => &IQ1_S,
        GgmlType::IQ1_M => &IQ1_M,
        GgmlType::TQ1_0 => &TQ1_0,
        GgmlType::MXFP4 => &MXFP4,
        _ => return None,
    })
}

/// IQ2_XXS: `d` f16 @0, then per 32 values 8 bytes @`2 + 8 ib`: four grid indices (8
/// values each) and a u32 of four 7-bit sign indices and the 4-bit scale (bits 28..32).
static IQ2_XXS: Routine = Routine {
    ggml: "dequantize_row_iq2_xxs",
    tables: &[&IQ2XXS, &KSIGNS],
    body: r#"    const GMEM u8* q = b + 2 + 8 * (i / 32);
    const u32 aux = (u32)*(const GMEM u16*)(q + 4) | ((u32)*(const GMEM u16*)(q + 6) << 16);
    const float db = F16_TO_F32(*(const GMEM u16*)b) * (0.5f + (float)(aux >> 28)) * 0.25f;
    const u32 mag = (u32)(iq2xxs_grid[q[(i / 8) % 4]] >> (8 * (i % 8))) & 0xffu;
    const u32 signs = ksigns_iq2xs[(aux >> (7 * ((i / 8) % 4))) & 127u];
    const float y = db * (float)mag;
    return ((signs >> (i % 8)) & 1u) ? -y : y;"#,
};

/// IQ2_XS: `d` @0, `qs[32]` (u16) @2: a 9-bit grid index and a 7-bit sign index per 8
/// values; `scales[8]` @66: a 4-bit scale per 16 values.
static IQ2_XS: Routine = Routine {
    ggml: "dequantize_row_iq2_xs",
    tables: &[&IQ2XS, &KSIGNS],
    body: r#"    const u32 q = *(const GMEM u16*)(b + 2 + 2 * (i / 8));
    const u32 ls = ((u32)b[66 + i / 32] >> (4 * ((i / 16) % 2))) & 15u;
    const float db = F16_TO_F32(*(const GMEM u16*)b) * (0.5f + (float)ls) * 0.25f;
    const u32 mag = (u32)(iq2xs_grid[q & 511u] >> (8 * (i % 8))) & 0xffu;
    const u32 signs = ksigns_iq2xs[q >> 9];
    const float y = db * (float)mag;
    return ((signs >> (i % 8)) & 1u) ? -y : y;"#,
};

/// IQ2_S: `d` @0, `qs[32]` @2 (low 8 bits of the grid indices), the signs @34 (a byte per
/// 8 values), `qh[8]` @66 (bits 8..10 of the indices), `scales[8]` @74 (as IQ2_XS).
static IQ2_S: Routine = Routine {
    ggml: "dequantize_row_iq2_s",
    tables: &[&IQ2S],
    body: r#"    const i32 k = i / 8;
    const u32 index = (u32)b[2 + k] | ((((u32)b[66 + i / 32] >> (2 * (k % 4))) & 3u) << 8);
    const u32 ls = ((u32)b[74 + i / 32] >> (4 * ((i / 16) % 2))) & 15u;
    const float db = F16_TO_F32(*(const GMEM u16*)b) * (0.5f + (float)ls) * 0.25f;
    const u32 mag = (u32)(iq2s_grid[index] >> (8 * (i % 8))) & 0xffu;
    const float y = db * (float)mag;
    return (((u32)b[34 + k] >> (i % 8)) & 1u) ? -y : y;"#,
};

/// IQ3_XXS: `d` @0, `qs[64]` @2 (a grid index per 4 values), `scales_and_signs` @66 (per
/// 32 values a u32 laid out as IQ2_XXS's).
static IQ3_XXS: Routine = Routine {
    ggml: "dequantize_row_iq3_xxs",
    tables: &[&IQ3XXS, &KSIGNS],
    body: r#"    const GMEM u8* ss = b + 66 + 4 * (i / 32);
    const u32 aux = (u32)*(const GMEM u16*)ss | ((u32)*(const GMEM u16*)(ss + 2) << 16);
    const float db = F16_TO_F32(*(const GMEM u16*)b) * (0.5f + (float)(aux >> 28)) * 0.5f;
    const u32 mag = (iq3xxs_grid[b[2 + i / 4]] >> (8 * (i % 4))) & 0xffu;
    const u32 signs = ksigns_iq2xs[(aux >> (7 * ((i / 8) % 4))) & 127u];
    const float y = db * (float)mag;
    return ((signs >> (i % 8)) & 1u) ? -y : y;"#,
};

/// IQ3_S: `d` @0, `qs[64]` @2 (low 8 bits of the grid indices), `qh[8]` @66 (bit 8),
/// `signs[32]` @74 (a bit per value), `scales[4]` @106 (a 4-bit scale per 32 values).
static IQ3_S: Routine = Routine {
    ggml: "dequantize_row_iq3_s",
    tables: &[&IQ3S],
    body: r#"    const i32 ib = i / 32;
    const u32 index = (u32)b[2 + i / 4] | ((((u32)b[66 + ib] >> ((i / 4) % 8)) & 1u) << 8);
    const i32 ls = (i32)(((u32)b[106 + ib / 2] >> (4 * (ib % 2))) & 15u);
    const float db = F16_TO_F32(*(const GMEM u16*)b) * (float)(1 + 2 * ls);
    const u32 mag = (iq3s_grid[index] >> (8 * (i % 4))) & 0xffu;
    const float y = db * (float)mag;
    return (((u32)b[74 + i / 8] >> (i % 8)) & 1u) ? -y : y;"#,
};

/// IQ1_S: `d` @0, `qs[32]` @2 (low 8 bits of the grid indices), `qh[8]` (u16) @34 per 32
/// values: 3 high index bits per 8 values, the 3-bit scale (bits 12..15), the delta's sign
/// (bit 15).
static IQ1_S: Routine = Routine {
    ggml: "dequantize_row_iq1_s",
    tables: &[&IQ1S],
    body: r#"    const u32 qh = *(const GMEM u16*)(b + 34 + 2 * (i / 32));
    const u32 index = (u32)b[2 + i / 8] | (((qh >> (3 * ((i / 8) % 4))) & 7u) << 8);
    const float dl = F16_TO_F32(*(const GMEM u16*)b) * (float)(2 * (i32)((qh >> 12) & 7u) + 1);
    const float delta = (qh & 0x8000u) ? -0.125f : 0.125f;
    const i32 g = (i32)(i8)(u8)(iq1s_grid[index] >> (8 * (i % 8)));
    return dl * ((float)g + delta);"#,
};

/// IQ1_M: `qs[32]` @0 (low 8 bits of the grid indices), `qh[16]` @32 (a nibble per 8
/// values: 3 high index bits, the delta's sign), `scales` (four u16) @48: a 3-bit scale
/// per 16 values, the f16 `d` in their top nibbles.
static IQ1_M: Routine = Routine {
    ggml: "dequantize_row_iq1_m",
    tables: &[&IQ1S],
    body: r#"    const GMEM u16* sc = (const GMEM u16*)(b + 48);
    const u32 dbits = ((u32)sc[0] >> 12) | (((u32)sc[1] >> 8) & 0x00f0u) |
                      (((u32)sc[2] >> 4) & 0x0f00u) | ((u32)sc[3] & 0xf000u);
    const i32 ib = i / 32;
    const u32 ls = ((u32)sc[ib / 2] >> (6 * (ib % 2) + 3 * ((i / 16) % 2))) & 7u;
    const i32 k = i / 8;
    const u32 nib = ((u32)b[32 + k / 2] >> (4 * (k % 2))) & 15u;
    const u32 index = (u32)b[k] | ((nib & 7u) << 8);
    const float dl = F16_TO_F32(dbits) * (float)(2 * (i32)ls + 1);
    const float delta = (nib & 8u) ? -0.125f : 0.125f;
    const i32 g = (i32)(i8)(u8)(iq1s_grid[index] >> (8 * (i % 8)));
    return dl * ((float)g + delta);"#,
};

/// TQ1_0: `qs[48]` @0 (five base-3 digits a byte), `qh[4]` @48 (four), `d` @52. Digit `n`
/// of byte `q` is `((q * 3^n mod 256) * 3) >> 8`; values 0..160 are the digits of
/// `qs[0..32]`, 160..240 of `qs[32..48]`, 240..256 of `qh`.
static TQ1_0: Routine = Routine {
    ggml: "dequantize_row_tq1_0",
    tables: &[],
    body: r#"    u32 q; i32 n;
    if (i < 160) { q = b[i % 32]; n = i / 32; }
    else if (i < 240) { q = b[32 + (i - 160) % 16]; n = (i - 160) / 16; }
    else { q = b[48 + (i - 240) % 4]; n = (i - 240) / 4; }
    const u32 pow3 = n < 4 ? (0x1b090301u >> (8 * n)) & 0xffu : 81u;
    const i32 digit = (i32)((((q * pow3) & 0xffu) * 3u) >> 8);
    return (float)(digit - 1) * F16_TO_F32(*(const GMEM u16*)(b + 52));"#,
};

/// MXFP4: `e` @0 (E8M0), `qs[16]` @1 (nibbles as IQ4_NL's). The scale is
/// `GGML_E8M0_TO_FP32_HALF(e)`, `2^(e - 128)`: the table holds the E2M1 values doubled.
static MXFP4: Routine = Routine {
    ggml: "dequantize_row_mxfp4",
    tables: &[&MXFP4_VALUES],
    body: r#"    const u32 e = b[0];
    const float d = AS_FLOAT(e < 2u ? 0x00200000u << e : (e - 1u) << 23);
    const u32 q = b[1 + i % 16];
    return (float)kvalues_mxfp4[i < 16 ? q & 15u : q >> 4] * d;"#,
};

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::dequant::{has_dequantizer, print};

    const TABLES: [&Table; 8] = [
        &IQ2XXS,
        &IQ2XS,
        &IQ2S,
        &IQ3XXS,
        &IQ3S,
        &IQ1S,
        &KSIGNS,
        &MXFP4_VALUES,
    ];

    #[test]
    fn every_routine_format_has_a_routine_and_prints() {
        for f in ir::ggml::block_formats() {
            let routine_format = matches!(f.decode, ir::ggml::Decode::Routine);
            assert_eq!(routine(f.ty).is_some(), routine_format, "{}", f.ty.name());
            assert!(has_dequantizer(f.ty), "{}", f.ty.name());
            let s = print(f).unwrap_or_else(|e| panic!("{e}"));
            assert!(s.contains(&format!("FN float dq_{}(", f.ty.name())), "{s}");
        }
    }

    /// A routine lists exactly the tables its body reads (they are printed from the list).
    #[test]
    fn routines_list_the_tables_they_read() {
        for &t in GgmlType::ALL {
            let Some(r) = routine(t) else { continue };
            for table in TABLES {
                let listed = r.tables.iter().any(|u| u.name == table.name);
                let read = r.body.contains(&format!("{}[", table.name));
                assert_eq!(listed, read, "{}: {}", t.name(), table.name);
            }
        }
        // Every table together (a model using every type): inside the 64 KiB of CUDA's
        // `__constant__` bank, where prelude.cuh puts them.
        let total: usize = TABLES.iter().map(|t| t.bytes()).sum();
        assert_eq!(total, 2048 + 4096 + 8192 + 1024 + 2048 + 16384 + 128 + 16);
    }

    #[test]
    fn tables_print_every_entry() {
        let s = IQ2XXS.print();
        assert!(s.contains("CONSTANT u64 iq2xxs_grid[256] = {\n    0x0808080808080808,"));
        assert_eq!(s.matches("0x").count(), 256);
        let s = MXFP4_VALUES.print();
        assert!(
            s.contains("CONSTANT i8 kvalues_mxfp4[16] = {\n    0, 1, 2, 3, 4, 6, 8, 12, 0, -1,")
        );
    }
}
