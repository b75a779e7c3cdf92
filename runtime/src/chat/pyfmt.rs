//! Python's text forms of template values, so a template prints what Jinja2 (under Hugging
//! Face `apply_chat_template`) prints:
//!
//! - [`py_str`]: `str(value)` — what `{{ value }}` and the `string` filter give: `None`,
//!   `True`/`False`, `1.0`, `1e+16`, and lists / dicts in their `repr` form (`['a', 1]`,
//!   `{'k': None}`).
//! - [`py_json`]: `json.dumps(value, ensure_ascii=..., indent=..., separators=...,
//!   sort_keys=...)` — the `tojson` filter Hugging Face installs (Python's `json` module
//!   defaults: `", "` / `": "` separators, `","` between items once `indent` is given).
//!
//! Undefined prints as the empty string (Jinja2's default `Undefined`), but cannot be dumped as
//! JSON (Python raises `TypeError: Object of type Undefined is not JSON serializable`).

use minijinja::value::ValueKind;
use minijinja::Value;
use std::fmt::Write as _;

/// `repr(float)` / `str(float)` in Python 3: the shortest digits that round-trip, positional
/// for decimal exponents -4..16, scientific (`1e+16`, `1.5e-05`) outside, and always a
/// `.0` on integral positional values.
pub fn py_float(v: f64) -> String {
    if v.is_nan() {
        return "nan".into();
    }
    if v.is_infinite() {
        return if v > 0.0 { "inf".into() } else { "-inf".into() };
    }
    if v == 0.0 {
        return if v.is_sign_negative() {
            "-0.0".into()
        } else {
            "0.0".into()
        };
    }
    // Rust's `{:e}` gives the shortest round-trip digits: "d.ddde[-]x".
    let sci = format!("{:e}", v.abs());
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    let sign = if v < 0.0 { "-" } else { "" };
    if (-4..16).contains(&exp) {
        let n = digits.len() as i32;
        let s = if exp < 0 {
            format!("0.{}{}", "0".repeat((-exp - 1) as usize), digits)
        } else if exp + 1 >= n {
            format!("{}{}.0", digits, "0".repeat((exp + 1 - n) as usize))
        } else {
            let (a, b) = digits.split_at((exp + 1) as usize);
            format!("{a}.{b}")
        };
        format!("{sign}{s}")
    } else {
        let m = if digits.len() > 1 {
            format!("{}.{}", &digits[..1], &digits[1..])
        } else {
            digits
        };
        let esign = if exp < 0 { '-' } else { '+' };
        format!("{sign}{m}e{esign}{:02}", exp.abs())
    }
}

/// Python `repr(str)`: single quotes unless the text holds `'` and no `"`; backslash escapes
/// for the quote, `\\`, `\n`, `\r`, `\t`, and `\xNN` / `\uNNNN` for other control characters.
/// (Python also escapes other non-printable code points; only the C0/C1 controls, U+2028/9
/// and U+FEFF are treated so here.)
pub fn py_repr_str(s: &str, out: &mut String) {
    let quote = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if (c as u32) < 0x20 || (0x7f..0xa1).contains(&(c as u32)) || c == '\u{ad}' => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            '\u{2028}' | '\u{2029}' | '\u{feff}' => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push(quote);
}

/// Python `str(value)` for a template value (see the module doc).
pub fn py_str(value: &Value) -> String {
    match value.kind() {
        ValueKind::String => value.as_str().unwrap_or_default().to_string(),
        ValueKind::Undefined => String::new(),
        _ => {
            let mut out = String::new();
            py_repr(value, &mut out, 0);
            out
        }
    }
}

/// Nesting limit for printing containers (a template cannot build cycles, but stay bounded).
const MAX_DEPTH: usize = 256;

/// Python `repr(value)`, appended to `out`.
fn py_repr(value: &Value, out: &mut String, depth: usize) {
    if depth > MAX_DEPTH {
        out.push_str("...");
        return;
    }
    match value.kind() {
        ValueKind::Undefined => {}
        ValueKind::None => out.push_str("None"),
        ValueKind::Bool => out.push_str(if value.is_true() { "True" } else { "False" }),
        ValueKind::Number => {
            if value.is_integer() {
                let _ = write!(out, "{value}");
            } else {
                match f64::try_from(value.clone()) {
                    Ok(f) => out.push_str(&py_float(f)),
                    Err(_) => {
                        let _ = write!(out, "{value}");
                    }
                }
            }
        }
        ValueKind::String => py_repr_str(value.as_str().unwrap_or_default(), out),
        ValueKind::Seq | ValueKind::Iterable => {
            out.push('[');
            if let Ok(iter) = value.try_iter() {
                for (i, item) in iter.enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    py_repr(&item, out, depth + 1);
                }
            }
            out.push(']');
        }
        ValueKind::Map => {
            out.push('{');
            if let Ok(iter) = value.try_iter() {
                for (i, key) in iter.enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    py_repr(&key, out, depth + 1);
                    out.push_str(": ");
                    let item = value.get_item(&key).unwrap_or_default();
                    py_repr(&item, out, depth + 1);
                }
            }
            out.push('}');
        }
        _ => {
            let _ = write!(out, "{value}");
        }
    }
}

/// The arguments of Python's `json.dumps` that the `tojson` filter passes on.
#[derive(Debug, Clone, Default)]
pub struct JsonStyle {
    /// Escape every non-ASCII character as `\uXXXX` (Hugging Face passes `false`).
    pub ensure_ascii: bool,
    /// Pretty-print with this string per level (`indent=2` is two spaces); `None` = one line.
    pub indent: Option<String>,
    /// `(item_separator, key_separator)`; `None` = Python's default for the `indent` given.
    pub separators: Option<(String, String)>,
    /// Sort map keys (as strings).
    pub sort_keys: bool,
}

/// Python `json.dumps(value, ...)` of a template value.
///
/// Errors: a message naming the value's kind for what JSON cannot hold (undefined, functions,
/// other objects), as Python's `TypeError: Object of type X is not JSON serializable`.
pub fn py_json(value: &Value, style: &JsonStyle) -> Result<String, String> {
    let (item_sep, key_sep) = match &style.separators {
        Some((a, b)) => (a.as_str(), b.as_str()),
        None if style.indent.is_some() => (",", ": "),
        None => (", ", ": "),
    };
    let mut w = JsonWriter {
        style,
        item_sep,
        key_sep,
        out: String::new(),
    };
    w.value(value, 0)?;
    Ok(w.out)
}

struct JsonWriter<'a> {
    style: &'a JsonStyle,
    item_sep: &'a str,
    key_sep: &'a str,
    out: String,
}

impl JsonWriter<'_> {
    fn newline(&mut self, depth: usize) {
        if let Some(indent) = &self.style.indent {
            self.out.push('\n');
            for _ in 0..depth {
                self.out.push_str(indent);
            }
        }
    }

    fn string(&mut self, s: &str) {
        let out = &mut self.out;
        out.push('"');
        for c in s.chars() {
            match c {
                '"' => out.push_str("\\\""),
                '\\' => out.push_str("\\\\"),
                '\n' => out.push_str("\\n"),
                '\r' => out.push_str("\\r"),
                '\t' => out.push_str("\\t"),
                '\u{8}' => out.push_str("\\b"),
                '\u{c}' => out.push_str("\\f"),
                c if (c as u32) < 0x20 => {
                    let _ = write!(out, "\\u{:04x}", c as u32);
                }
                c if self.style.ensure_ascii && !c.is_ascii() => {
                    let mut buf = [0u16; 2];
                    for unit in c.encode_utf16(&mut buf) {
                        let _ = write!(out, "\\u{unit:04x}");
                    }
                }
                c => out.push(c),
            }
        }
        out.push('"');
    }

    fn number(&mut self, value: &Value) {
        if value.is_integer() {
            let _ = write!(self.out, "{value}");
            return;
        }
        match f64::try_from(value.clone()) {
            Ok(f) if f.is_nan() => self.out.push_str("NaN"),
            Ok(f) if f.is_infinite() => {
                self.out
                    .push_str(if f > 0.0 { "Infinity" } else { "-Infinity" })
            }
            Ok(f) => self.out.push_str(&py_float(f)),
            Err(_) => {
                let _ = write!(self.out, "{value}");
            }
        }
    }

    /// A map key as Python's `json` writes it: strings as they are, numbers, booleans and
    /// `None` converted (`"1"`, `"true"`, `"null"`).
    fn key_text(key: &Value) -> Result<String, String> {
        Ok(match key.kind() {
            ValueKind::String => key.as_str().unwrap_or_default().to_string(),
            ValueKind::None => "null".into(),
            ValueKind::Bool => if key.is_true() { "true" } else { "false" }.into(),
            ValueKind::Number if key.is_integer() => key.to_string(),
            ValueKind::Number => py_float(f64::try_from(key.clone()).unwrap_or(f64::NAN)),
            kind => {
                return Err(format!(
                    "keys must be str, int, float, bool or None, not {kind}"
                ))
            }
        })
    }

    fn value(&mut self, value: &Value, depth: usize) -> Result<(), String> {
        if depth > MAX_DEPTH {
            return Err("tojson: value nested too deeply".into());
        }
        match value.kind() {
            ValueKind::None => self.out.push_str("null"),
            ValueKind::Bool => self
                .out
                .push_str(if value.is_true() { "true" } else { "false" }),
            ValueKind::Number => self.number(value),
            ValueKind::String => self.string(value.as_str().unwrap_or_default()),
            ValueKind::Seq | ValueKind::Iterable => {
                let items: Vec<Value> = value.try_iter().map_err(|e| e.to_string())?.collect();
                if items.is_empty() {
                    self.out.push_str("[]");
                    return Ok(());
                }
                self.out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        self.out.push_str(self.item_sep);
                    }
                    self.newline(depth + 1);
                    self.value(item, depth + 1)?;
                }
                self.newline(depth);
                self.out.push(']');
            }
            ValueKind::Map => {
                let mut entries = Vec::new();
                for key in value.try_iter().map_err(|e| e.to_string())? {
                    let item = value.get_item(&key).map_err(|e| e.to_string())?;
                    entries.push((Self::key_text(&key)?, item));
                }
                if self.style.sort_keys {
                    entries.sort_by(|a, b| a.0.cmp(&b.0));
                }
                if entries.is_empty() {
                    self.out.push_str("{}");
                    return Ok(());
                }
                self.out.push('{');
                for (i, (key, item)) in entries.iter().enumerate() {
                    if i > 0 {
                        self.out.push_str(self.item_sep);
                    }
                    self.newline(depth + 1);
                    self.string(key);
                    self.out.push_str(self.key_sep);
                    self.value(item, depth + 1)?;
                }
                self.newline(depth);
                self.out.push('}');
            }
            ValueKind::Undefined => {
                return Err("Object of type Undefined is not JSON serializable".into())
            }
            kind => return Err(format!("Object of type {kind} is not JSON serializable")),
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_print_like_python() {
        let cases = [
            (1.0, "1.0"),
            (0.1, "0.1"),
            (-2.5, "-2.5"),
            (1e16, "1e+16"),
            (1.5e-5, "1.5e-05"),
            (0.0001, "0.0001"),
            (123456789012345.0, "123456789012345.0"),
            (1234567890123456.0, "1234567890123456.0"),
            (f64::NAN, "nan"),
        ];
        for (v, want) in cases {
            assert_eq!(py_float(v), want, "{v:e}");
        }
    }

    #[test]
    fn str_and_repr() {
        let v = Value::from_iter([Value::from("it's"), Value::from(()), Value::from(true)]);
        assert_eq!(py_str(&v), "[\"it's\", None, True]");
        assert_eq!(py_str(&Value::from("a\nb")), "a\nb");
        assert_eq!(py_str(&Value::UNDEFINED), "");
    }

    #[test]
    fn json_styles() {
        let map: indexmap::IndexMap<Value, Value> = [
            (Value::from("b"), Value::from_iter([1, 2])),
            (Value::from("a"), Value::from("é\"\u{1}")),
        ]
        .into_iter()
        .collect();
        let v = Value::from(map);
        let plain = JsonStyle::default();
        assert_eq!(
            py_json(&v, &plain).unwrap(),
            r#"{"b": [1, 2], "a": "é\"\u0001"}"#
        );
        let style = JsonStyle {
            indent: Some("  ".into()),
            sort_keys: true,
            ensure_ascii: true,
            ..Default::default()
        };
        assert_eq!(
            py_json(&v, &style).unwrap(),
            "{\n  \"a\": \"\\u00e9\\\"\\u0001\",\n  \"b\": [\n    1,\n    2\n  ]\n}"
        );
        let compact = JsonStyle {
            separators: Some((",".into(), ":".into())),
            ..Default::default()
        };
        assert_eq!(
            py_json(&v, &compact).unwrap(),
            r#"{"b":[1,2],"a":"é\"\u0001"}"#
        );
        assert!(py_json(&Value::UNDEFINED, &plain).is_err());
    }
}
