//! Addressing of plan values in the three buffers of the ABI, as C expressions.
//!
//! A [`Val`] is a value with the byte offset of its first element in its buffer resolved;
//! [`Val::load`] and [`Val::store`] print an element access for index expressions
//! `[i0, i1, i2, i3]` (ggml `ne` order; `i0` counts values, also for block types).

use super::dequant;
use ir::graph::DType;
use ir::plan::Value;
use std::collections::BTreeSet;

/// One of the three kernel buffers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Buf {
    /// The step's arena (writable).
    Arena,
    /// The KV memory (writable).
    Kv,
    /// The weights (read only).
    Wts,
}

impl Buf {
    fn name(self) -> &'static str {
        match self {
            Buf::Arena => "arena",
            Buf::Kv => "kv",
            Buf::Wts => "wts",
        }
    }
}

/// A value placed in a buffer.
#[derive(Clone, Debug)]
pub struct Val {
    /// Its buffer.
    pub buf: Buf,
    /// Byte offset of element 0 in the buffer.
    pub off: u64,
    /// The kernel argument holding `off`: `ops.at[slot]`.
    pub slot: usize,
    /// Element type.
    pub dtype: DType,
    /// Shape at the bound (ggml `ne`).
    pub ne: [u64; 4],
    /// Byte strides.
    pub nb: [u64; 4],
    /// Bit `d` set: dimension `d` is the runtime KV length.
    pub kv: u8,
    /// An expression to read `off` from instead of `ops.at[slot]` (a kernel that picks
    /// one of several same-shaped operands at run time names it in a variable).
    pub at: Option<String>,
}

impl Val {
    /// `v` at byte `base` of `buf`, its offset passed in `ops.at[slot]`.
    pub fn new(v: &Value, buf: Buf, base: u64, slot: usize) -> Val {
        Val {
            buf,
            off: base + v.offset,
            slot,
            dtype: v.dtype,
            ne: v.shape.ne,
            nb: v.nb,
            kv: v.shape.kv,
            at: None,
        }
    }

    /// Elements at the bound.
    pub fn n_elements(&self) -> u64 {
        self.ne.iter().product()
    }

    /// Rows (`ne1 * ne2 * ne3`).
    pub fn n_rows(&self) -> u64 {
        self.ne[1] * self.ne[2] * self.ne[3]
    }

    /// Whether `ne0` is contiguous (`nb0` is the element size) for a plain type.
    pub fn dense_rows(&self) -> bool {
        self.dtype.block_size() == 1 && self.nb[0] == self.dtype.type_size()
    }

    /// The byte offset of the element (or, for block types, of the block holding value
    /// `i0`) at `idx`, as an expression.
    pub fn byte(&self, idx: &[&str; 4]) -> String {
        let mut s = match &self.at {
            Some(e) => e.clone(),
            None => format!("ops.at[{}]", self.slot),
        };
        let bs = self.dtype.block_size();
        for d in 0..4 {
            if self.ne[d] == 1 && self.kv & (1 << d) == 0 || self.nb[d] == 0 {
                continue;
            }
            let i = if d == 0 && bs > 1 {
                format!("({}) / {bs}", idx[0])
            } else {
                format!("({})", idx[d])
            };
            s += &format!(" + (u64){i} * {}u", self.nb[d]);
        }
        s
    }

    /// The `float` at `idx` (dequantized for block types; `needs` collects the GGML ids
    /// of the types whose dequantizers it calls).
    pub fn load(&self, idx: &[&str; 4], needs: &mut BTreeSet<u32>) -> String {
        let b = self.buf.name();
        let at = self.byte(idx);
        match self.dtype {
            DType::F32 => format!("*(const GMEM float*)({b} + {at})"),
            DType::F16 => format!("F16_TO_F32(*(const GMEM u16*)({b} + {at}))"),
            DType::BF16 => format!("BF16_TO_F32(*(const GMEM u16*)({b} + {at}))"),
            DType::I32 => format!("(float)*(const GMEM i32*)({b} + {at})"),
            DType::Block(t) => {
                needs.insert(t.id());
                format!(
                    "{}({b} + {at}, ({}) % {})",
                    dequant::fn_name(t),
                    idx[0],
                    t.block_size()
                )
            }
        }
    }

    /// The `i32` at `idx` of an I32 value.
    pub fn load_i32(&self, idx: &[&str; 4]) -> String {
        format!(
            "*(const GMEM i32*)({} + {})",
            self.buf.name(),
            self.byte(idx)
        )
    }

    /// A statement storing `float` expression `x` at `idx` (F32, F16 or BF16 values; block
    /// types are stored by their kernels).
    pub fn store(&self, idx: &[&str; 4], x: &str) -> String {
        let b = self.buf.name();
        let at = self.byte(idx);
        match self.dtype {
            DType::F16 => format!("*(GMEM u16*)({b} + {at}) = F32_TO_F16({x});"),
            DType::BF16 => format!(
                "*(GMEM u16*)({b} + {at}) = (u16)((AS_UINT({x}) + 0x7fffu + ((AS_UINT({x}) >> 16) & 1u)) >> 16);"
            ),
            _ => format!("*(GMEM float*)({b} + {at}) = {x};"),
        }
    }

    /// Pointer expression to byte `at` of this value's buffer.
    pub fn ptr(&self, at: &str) -> String {
        format!("({} + {at})", self.buf.name())
    }
}

/// The four indices of element `idx` of a value of shape `ne` (row-major over `ne`, `ne0`
/// fastest), as statements declaring `i0..i3` from the `i64` expression `idx`.
pub fn split_index(idx: &str, ne: &[u64; 4]) -> String {
    format!(
        "const i32 i0 = (i32)(({idx}) % {}); const i32 i1 = (i32)((({idx}) / {}) % {}); \
         const i32 i2 = (i32)((({idx}) / {}) % {}); const i32 i3 = (i32)(({idx}) / {});",
        ne[0],
        ne[0],
        ne[1],
        ne[0] * ne[1],
        ne[2],
        ne[0] * ne[1] * ne[2]
    )
}

/// The index expressions of a source broadcast over a result (ggml's repeat: index `i_d`
/// of the result reads `i_d % ne_d` of the source).
pub fn broadcast(src: &[u64; 4], dst: &[u64; 4]) -> [String; 4] {
    let names = ["i0", "i1", "i2", "i3"];
    std::array::from_fn(|d| {
        if src[d] == dst[d] {
            names[d].to_string()
        } else if src[d] == 1 {
            "0".to_string()
        } else {
            format!("({} % {})", names[d], src[d])
        }
    })
}

/// `[&str; 4]` view of owned index strings.
pub fn refs(v: &[String; 4]) -> [&str; 4] {
    [&v[0], &v[1], &v[2], &v[3]]
}

/// A C float literal that reads back as exactly `x` (finite `x`).
pub fn flt(x: f32) -> String {
    if x.is_nan() {
        return "AS_FLOAT(0x7fc00000u)".into();
    }
    if x.is_infinite() {
        return if x > 0.0 {
            "AS_FLOAT(0x7f800000u)".into()
        } else {
            "AS_FLOAT(0xff800000u)".into()
        };
    }
    let s = format!("{x:?}");
    if s.contains('e') || s.contains('.') {
        format!("{s}f")
    } else {
        format!("{s}.0f")
    }
}
