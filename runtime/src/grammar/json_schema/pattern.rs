//! A schema's `pattern` (an anchored regular expression) as GBNF, as llama.cpp's
//! `_pattern_to_rule` translates it: literals (consecutive ones merged), `.` (any character
//! but a line break), `[...]` classes, groups (`(?:...)` too), `|`, `* + ?` and `{m,n}`.
//! Lookarounds, named groups, inner anchors and escapes GBNF lacks (`\d`, `\w`, ...) are
//! unsupported (the caller then accepts any string); malformed expressions are invalid.

use super::{repetition, Converter};
use std::collections::HashMap;

/// Most nesting of groups.
const MAX_DEPTH: usize = 100;

/// Characters with a meaning in a regular expression.
const NON_LITERAL: &[u8] = b"|.()[]{}*+?^$";

/// Why a pattern has no grammar.
pub enum PatternError {
    /// A valid expression GBNF cannot say (the caller accepts any string).
    Unsupported(String),
    /// Not a valid expression.
    Invalid(String),
}

use PatternError::{Invalid, Unsupported};

/// The length of the GBNF escape at `pos` (`\xHH`, `\uHHHH`, `\UHHHHHHHH`, `\t \r \n \\ \"
/// \[ \] \-`), or 0 when there is none (llama.cpp `gbnf_escape_length`).
fn escape_len(p: &[u8], pos: usize) -> usize {
    if pos + 1 >= p.len() || p[pos] != b'\\' {
        return 0;
    }
    let n_hex = match p[pos + 1] {
        b'x' => 2,
        b'u' => 4,
        b'U' => 8,
        b't' | b'r' | b'n' | b'\\' | b'"' | b'[' | b']' | b'-' => return 2,
        _ => return 0,
    };
    match p.get(pos + 2..pos + 2 + n_hex) {
        Some(h) if h.iter().all(u8::is_ascii_hexdigit) => 2 + n_hex,
        _ => 0,
    }
}

/// A piece of a sequence: text, and whether it is a literal (to be quoted and merged).
type Piece = (String, bool);

fn piece_rule(p: &Piece) -> String {
    if p.1 {
        format!("\"{}\"", p.0)
    } else {
        p.0.clone()
    }
}

struct Translator<'c, 'r> {
    conv: &'c mut Converter<'r>,
    p: Vec<u8>,
    i: usize,
    depth: usize,
    name: String,
    sub_rules: HashMap<String, String>,
}

/// The rule of a JSON string matching `pattern`, added under `name`; returns its name.
pub fn to_rule(
    conv: &mut Converter<'_>,
    pattern: &str,
    name: &str,
) -> Result<String, PatternError> {
    let b = pattern.as_bytes();
    if b.len() < 2 || b[0] != b'^' || b[b.len() - 1] != b'$' {
        return Err(Unsupported("not anchored with '^' and '$'".into()));
    }
    let mut t = Translator {
        conv,
        p: b[1..b.len() - 1].to_vec(),
        i: 0,
        depth: 0,
        name: name.to_string(),
        sub_rules: HashMap::new(),
    };
    let seq = t.sequence()?;
    let rule = piece_rule(&seq);
    if t.depth != 0 {
        return Err(Invalid("unbalanced parentheses".into()));
    }
    Ok(t.conv
        .add_rule(name, &format!("\"\\\"\" ({rule}) \"\\\"\"")))
}

impl Translator<'_, '_> {
    fn text(&self, from: usize, to: usize) -> String {
        String::from_utf8_lossy(self.p.get(from..to).unwrap_or(&[])).into_owned()
    }

    /// Joins `seq`, merging consecutive literals.
    fn join(seq: Vec<Piece>) -> Piece {
        let mut out: Vec<String> = Vec::new();
        let mut lit = String::new();
        for (s, is_lit) in seq {
            if is_lit {
                lit.push_str(&s);
            } else {
                if !lit.is_empty() {
                    out.push(format!("\"{lit}\""));
                    lit.clear();
                }
                out.push(s);
            }
        }
        if !lit.is_empty() {
            out.push(format!("\"{lit}\""));
        }
        (out.join(" "), false)
    }

    fn sequence(&mut self) -> Result<Piece, PatternError> {
        let mut seq: Vec<Piece> = Vec::new();
        let len = self.p.len();
        while self.i < len {
            let c = self.p[self.i];
            match c {
                b'.' => {
                    let dot = self.conv.add_rule("dot", "[^\\x0A\\x0D]");
                    seq.push((dot, false));
                    self.i += 1;
                }
                b'(' => {
                    self.i += 1;
                    if self.p.get(self.i) == Some(&b'?') {
                        if self.p.get(self.i + 1) == Some(&b':') {
                            self.i += 2;
                        } else {
                            return Err(Unsupported("unsupported group syntax".into()));
                        }
                    }
                    self.depth += 1;
                    if self.depth > MAX_DEPTH {
                        return Err(Unsupported("pattern nesting too deep".into()));
                    }
                    let inner = self.sequence()?;
                    seq.push((format!("({})", piece_rule(&inner)), false));
                }
                b')' => {
                    self.i += 1;
                    if self.depth == 0 {
                        return Err(Invalid("unbalanced parentheses".into()));
                    }
                    self.depth -= 1;
                    return Ok(Self::join(seq));
                }
                b'^' | b'$' => return Err(Unsupported("anchor inside the pattern".into())),
                b'[' => {
                    let start = self.i;
                    self.i += 1;
                    while self.i < len && self.p[self.i] != b']' {
                        if self.p[self.i] == b'\\' {
                            let n = escape_len(&self.p, self.i);
                            if n == 0 {
                                return Err(Unsupported(format!(
                                    "unsupported escape in character class: {}",
                                    self.text(self.i, (self.i + 2).min(len))
                                )));
                            }
                            self.i += n;
                        } else {
                            self.i += 1;
                        }
                    }
                    if self.i >= len {
                        return Err(Invalid("unterminated character class".into()));
                    }
                    self.i += 1;
                    seq.push((self.text(start, self.i), false));
                }
                b'|' => {
                    seq.push(("|".into(), false));
                    self.i += 1;
                }
                b'*' | b'+' | b'?' => {
                    let Some(last) = seq.pop() else {
                        return Err(Invalid("nothing to repeat".into()));
                    };
                    seq.push((format!("{}{}", piece_rule(&last), c as char), false));
                    self.i += 1;
                }
                b'{' => {
                    let start = self.i + 1;
                    while self.i < len && self.p[self.i] != b'}' {
                        self.i += 1;
                    }
                    if self.i >= len {
                        return Err(Unsupported("unterminated curly brackets".into()));
                    }
                    let inner = self.text(start, self.i);
                    self.i += 1;
                    let nums: Vec<&str> = inner.split(',').collect();
                    let num = |s: &str| -> Result<u64, PatternError> {
                        s.trim()
                            .parse::<u64>()
                            .ok()
                            .filter(|&n| n <= i32::MAX as u64)
                            .ok_or_else(|| Unsupported("invalid number in curly brackets".into()))
                    };
                    let (min, max) = match nums.as_slice() {
                        [n] => {
                            let n = num(n)?;
                            (n, Some(n))
                        }
                        [a, b] => (
                            if a.is_empty() { 0 } else { num(a)? },
                            if b.is_empty() { None } else { Some(num(b)?) },
                        ),
                        _ => {
                            return Err(Unsupported(
                                "wrong number of values in curly brackets".into(),
                            ))
                        }
                    };
                    if max.is_some_and(|m| m < min) {
                        return Err(Invalid(format!(
                            "repetition {{{inner}}}: the maximum is below the minimum"
                        )));
                    }
                    let Some((sub, is_lit)) = seq.pop() else {
                        return Err(Invalid("nothing to repeat".into()));
                    };
                    let item = if is_lit {
                        format!("\"{sub}\"")
                    } else {
                        match self.sub_rules.get(&sub) {
                            Some(id) => id.clone(),
                            None => {
                                let n = self.sub_rules.len() + 1;
                                let id = self.conv.add_rule(&format!("{}-{n}", self.name), &sub);
                                self.sub_rules.insert(sub, id.clone());
                                id
                            }
                        }
                    };
                    seq.push((repetition(&item, min, max, ""), false));
                }
                _ => {
                    let mut lit = String::new();
                    let non_lit = |c: u8| NON_LITERAL.contains(&c);
                    while self.i < len {
                        let ch = self.p[self.i];
                        if ch == b'\\' {
                            if self.i == len - 1 {
                                return Err(Invalid("trailing backslash".into()));
                            }
                            let next = self.p[self.i + 1];
                            if NON_LITERAL.contains(&next) {
                                lit.push(next as char);
                                self.i += 2;
                            } else {
                                let n = escape_len(&self.p, self.i);
                                if n == 0 {
                                    return Err(Unsupported(format!(
                                        "unsupported escape: {}",
                                        self.text(self.i, self.i + 2)
                                    )));
                                }
                                lit.push_str(&self.text(self.i, self.i + n));
                                self.i += n;
                            }
                        } else if ch == b'"' {
                            lit.push_str("\\\"");
                            self.i += 1;
                        } else if !non_lit(ch)
                            && (self.i == len - 1
                                || lit.is_empty()
                                || self.p[self.i + 1] == b'.'
                                || !non_lit(self.p[self.i + 1]))
                        {
                            // One byte at a time: a multi-byte character's bytes stay together.
                            let n = utf8_len(ch).min(len - self.i);
                            lit.push_str(&self.text(self.i, self.i + n));
                            self.i += n;
                        } else {
                            break;
                        }
                    }
                    if lit.is_empty() {
                        return Err(Unsupported(format!("unsupported character: {}", c as char)));
                    }
                    seq.push((lit, true));
                }
            }
        }
        Ok(Self::join(seq))
    }
}

fn utf8_len(first: u8) -> usize {
    match first {
        0xF0..=0xFF => 4,
        0xE0..=0xEF => 3,
        0xC0..=0xDF => 2,
        _ => 1,
    }
}
