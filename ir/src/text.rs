//! What the text forms of the IR share: the [`ParseError`] every parser returns, how names
//! are written (bare or quoted), and the small line lexer the graph and plan parsers are
//! built on.
//!
//! The text forms are line-based. On each line, `;` starts a comment that runs to the end of
//! the line. A line is a sequence of tokens separated by white space:
//!
//! - punctuation: `,` `(` `)` `{` `}` `[` `]` `=` `:`;
//! - a quoted string: `"…"` with JSON escapes (how names that are not plain words are
//!   written);
//! - a word: any other run of characters (`blk.0.attn_q.weight`, `1e-5`, `kv≤256`, `@A+64`,
//!   `rms_norm+mul+mul_mat×3`, `%12`).
//!
//! A name is written bare when it is one word that does not start with `%` (which marks an
//! id: `%12` is tensor or value 12), else quoted. Numbers are written as Rust writes them:
//! integers in decimal, `f32` values with `{}` or `{:e}`, which give the shortest text that
//! reads back to the same bits, so every printed parameter survives a round trip.
//!
//! Parsers never panic, whatever the input: they return a [`ParseError`] naming the line,
//! the column and what was expected.

use crate::graph::{DType, Input, KvKind, Shape, MAX_DIMS};
use std::fmt;

/// Where text did not parse, and what was expected there.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParseError {
    /// 1-based line number.
    pub line: usize,
    /// 1-based column, in characters.
    pub col: usize,
    /// What was expected and what was found (`expected a shape like {576, 7}, found "x"`).
    pub msg: String,
}

impl ParseError {
    /// An error at `line`, `col` (1-based).
    pub fn new(line: usize, col: usize, msg: impl Into<String>) -> ParseError {
        ParseError {
            line,
            col,
            msg: msg.into(),
        }
    }
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "line {}, column {}: {}", self.line, self.col, self.msg)
    }
}

impl std::error::Error for ParseError {}

/// Whether `c` ends a word (white space, punctuation, a quote or a comment).
fn is_special(c: char) -> bool {
    c.is_whitespace()
        || c.is_control()
        || matches!(
            c,
            ',' | '(' | ')' | '{' | '}' | '[' | ']' | '=' | ':' | ';' | '"'
        )
}

/// A name as the text forms write it: bare when it is one plain word not starting with `%`,
/// else as a JSON string (`"q,k,v"`).
pub fn name(s: &str) -> String {
    if !s.is_empty() && !s.starts_with('%') && !s.chars().any(is_special) {
        s.to_string()
    } else {
        // Serializing a string cannot fail.
        serde_json::to_string(s).unwrap_or_default()
    }
}

/// The kind of a graph input or step input as the text forms write it: `tokens`,
/// `positions`, `output ids`, `weight`, `data`, `K cache of layer 3`.
pub fn input_kind(kind: &Input) -> String {
    match kind {
        Input::Tokens => "tokens".to_string(),
        Input::Positions => "positions".to_string(),
        Input::OutputIds => "output ids".to_string(),
        Input::Weight => "weight".to_string(),
        Input::KvCache { layer, kind } => format!("{kind:?} cache of layer {layer}"),
        Input::Data => "data".to_string(),
    }
}

/// A list of numbers as `[2, 128, 384, 98304]`.
pub(crate) fn list<T: fmt::Display>(xs: &[T]) -> String {
    let items: Vec<String> = xs.iter().map(|x| x.to_string()).collect();
    format!("[{}]", items.join(", "))
}

/// One token of a line.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Tok<'a> {
    /// A run of ordinary characters.
    Word(&'a str),
    /// A quoted string, unescaped.
    Str(String),
    /// One punctuation character.
    Punct(char),
    /// The end of the line (or a comment).
    End,
}

impl Tok<'_> {
    /// How an error message shows the token.
    pub(crate) fn describe(&self) -> String {
        match self {
            Tok::Word(w) => format!("`{w}`"),
            Tok::Str(s) => format!("{s:?}"),
            Tok::Punct(c) => format!("`{c}`"),
            Tok::End => "the end of the line".to_string(),
        }
    }
}

/// A token and the 1-based column where it starts.
#[derive(Clone, Debug)]
pub(crate) struct Token<'a> {
    pub tok: Tok<'a>,
    pub col: usize,
}

/// A lexer over one line, reading tokens on demand (so a parser can take the raw rest of
/// the line, as the plan's JSON `target=` annotations need).
#[derive(Clone, Debug)]
pub(crate) struct Cursor<'a> {
    text: &'a str,
    pos: usize,
    /// 1-based line number, for errors.
    pub line: usize,
}

impl<'a> Cursor<'a> {
    /// A cursor at the start of `text`, which is line `line`.
    pub fn new(text: &'a str, line: usize) -> Cursor<'a> {
        Cursor { text, pos: 0, line }
    }

    fn col_at(&self, pos: usize) -> usize {
        self.text[..pos].chars().count() + 1
    }

    fn skip_space(&mut self) {
        let rest = &self.text[self.pos..];
        let trimmed = rest.trim_start();
        self.pos += rest.len() - trimmed.len();
        if trimmed.starts_with(';') {
            self.pos = self.text.len();
        }
    }

    /// An error at column `col` of this line.
    pub fn err_at(&self, col: usize, msg: impl Into<String>) -> ParseError {
        ParseError::new(self.line, col, msg)
    }

    /// The next token, consumed.
    pub fn next(&mut self) -> Result<Token<'a>, ParseError> {
        self.skip_space();
        let start = self.pos;
        let col = self.col_at(start);
        let rest = &self.text[start..];
        let Some(c) = rest.chars().next() else {
            return Ok(Token { tok: Tok::End, col });
        };
        if c == '"' {
            let mut escaped = false;
            let mut end = None;
            for (i, ch) in rest.char_indices().skip(1) {
                if escaped {
                    escaped = false;
                } else if ch == '\\' {
                    escaped = true;
                } else if ch == '"' {
                    end = Some(i + 1);
                    break;
                }
            }
            let Some(end) = end else {
                return Err(self.err_at(col, "a quoted name is not closed (missing `\"`)"));
            };
            let s: String = serde_json::from_str(&rest[..end])
                .map_err(|e| self.err_at(col, format!("bad quoted name: {e}")))?;
            self.pos = start + end;
            return Ok(Token {
                tok: Tok::Str(s),
                col,
            });
        }
        if is_special(c) {
            self.pos = start + c.len_utf8();
            return Ok(Token {
                tok: Tok::Punct(c),
                col,
            });
        }
        let len = rest.find(is_special).unwrap_or(rest.len());
        self.pos = start + len;
        Ok(Token {
            tok: Tok::Word(&rest[..len]),
            col,
        })
    }

    /// The next token, not consumed.
    pub fn peek(&self) -> Result<Token<'a>, ParseError> {
        self.clone().next()
    }

    /// The token after the next one, not consumed.
    pub fn peek2(&self) -> Result<Token<'a>, ParseError> {
        let mut c = self.clone();
        c.next()?;
        c.next()
    }

    /// Whether only white space or a comment is left.
    pub fn at_end(&self) -> bool {
        let mut c = self.clone();
        c.skip_space();
        c.pos >= c.text.len()
    }

    /// The column of the next token.
    pub fn col(&self) -> usize {
        let mut c = self.clone();
        c.skip_space();
        c.col_at(c.pos)
    }

    /// The rest of the line as written (for JSON), and its column; consumes it.
    pub fn rest_raw(&mut self) -> (&'a str, usize) {
        let rest = &self.text[self.pos..];
        let col = self.col_at(self.pos);
        self.pos = self.text.len();
        (rest, col)
    }

    /// An error at the next token: `expected {what}, found {token}`.
    pub fn expected(&self, what: &str) -> ParseError {
        match self.peek() {
            Ok(t) => self.err_at(
                t.col,
                format!("expected {what}, found {}", t.tok.describe()),
            ),
            Err(e) => e,
        }
    }

    /// Consumes punctuation `c`, or fails naming `what` was expected.
    pub fn punct(&mut self, c: char) -> Result<(), ParseError> {
        match self.peek()?.tok {
            Tok::Punct(p) if p == c => {
                self.next()?;
                Ok(())
            }
            _ => Err(self.expected(&format!("`{c}`"))),
        }
    }

    /// Consumes punctuation `c` if it is next.
    pub fn eat_punct(&mut self, c: char) -> Result<bool, ParseError> {
        if self.peek()?.tok == Tok::Punct(c) {
            self.next()?;
            return Ok(true);
        }
        Ok(false)
    }

    /// Whether the next token is punctuation `c`.
    pub fn is_punct(&self, c: char) -> Result<bool, ParseError> {
        Ok(self.peek()?.tok == Tok::Punct(c))
    }

    /// Consumes the word `w`, or fails.
    pub fn keyword(&mut self, w: &str) -> Result<(), ParseError> {
        match self.peek()?.tok {
            Tok::Word(x) if x == w => {
                self.next()?;
                Ok(())
            }
            _ => Err(self.expected(&format!("`{w}`"))),
        }
    }

    /// Consumes the word `w` if it is next.
    pub fn eat_keyword(&mut self, w: &str) -> Result<bool, ParseError> {
        if self.peek()?.tok == Tok::Word(w) {
            self.next()?;
            return Ok(true);
        }
        Ok(false)
    }

    /// A word (not a quoted string) and its column.
    pub fn word(&mut self, what: &str) -> Result<(&'a str, usize), ParseError> {
        let t = self.peek()?;
        match t.tok {
            Tok::Word(w) => {
                self.next()?;
                Ok((w, t.col))
            }
            _ => Err(self.expected(what)),
        }
    }

    /// A name: a word or a quoted string.
    pub fn name(&mut self, what: &str) -> Result<(String, usize), ParseError> {
        let t = self.peek()?;
        match t.tok {
            Tok::Word(w) => {
                self.next()?;
                Ok((w.to_string(), t.col))
            }
            Tok::Str(s) => {
                self.next()?;
                Ok((s, t.col))
            }
            _ => Err(self.expected(what)),
        }
    }

    /// Fails unless only white space or a comment is left.
    pub fn end(&self) -> Result<(), ParseError> {
        if self.at_end() {
            Ok(())
        } else {
            Err(self.expected("the end of the line"))
        }
    }

    /// An integer word.
    pub fn int<T: std::str::FromStr>(&mut self, what: &str) -> Result<T, ParseError> {
        let t = self.peek()?;
        if let Tok::Word(w) = t.tok {
            if let Ok(v) = w.parse::<T>() {
                self.next()?;
                return Ok(v);
            }
        }
        Err(self.expected(what))
    }

    /// `key=INT`.
    pub fn key_int<T: std::str::FromStr>(&mut self, key: &str) -> Result<T, ParseError> {
        self.keyword(key)?;
        self.punct('=')?;
        self.int(&format!("a number for `{key}`"))
    }

    /// A shape as [`Shape`]'s `Display` writes it: `{576, 7}`, `{64, 2, kv≤256}`; missing
    /// trailing dimensions are 1.
    pub fn shape(&mut self) -> Result<Shape, ParseError> {
        if !self.is_punct('{')? {
            return Err(self.expected("a shape like {576, 7}"));
        }
        let open = self.next()?.col;
        let mut ne = [1u64; MAX_DIMS];
        let mut kv = 0u8;
        let mut d = 0;
        if self.eat_punct('}')? {
            return Ok(Shape { ne, kv });
        }
        loop {
            let (w, col) = self.word("a dimension (a number or kv≤N)")?;
            if d == MAX_DIMS {
                return Err(self.err_at(col, format!("a shape has at most {MAX_DIMS} dimensions")));
            }
            let (num, is_kv) = match w.strip_prefix("kv≤") {
                Some(n) => (n, true),
                None => (w, false),
            };
            ne[d] = num.parse::<u64>().map_err(|_| {
                self.err_at(
                    col,
                    format!("expected a dimension (a number or kv≤N), found `{w}`"),
                )
            })?;
            if is_kv {
                kv |= 1 << d;
            }
            d += 1;
            if self.eat_punct('}')? {
                break;
            }
            if !self.eat_punct(',')? {
                return Err(self.expected(&format!(
                    "`,` or `}}` to close the shape opened at column {open}"
                )));
            }
        }
        Ok(Shape { ne, kv })
    }

    /// A dtype as GGML spells it (`F32`, `Q4_K`).
    pub fn dtype(&mut self) -> Result<DType, ParseError> {
        let t = self.peek()?;
        if let Tok::Word(w) = t.tok {
            if let Some(d) = parse_dtype(w) {
                self.next()?;
                return Ok(d);
            }
        }
        Err(self.expected("a type (F32, F16, BF16, I32 or a GGML block type such as Q4_K)"))
    }

    /// A list of integers: `[2, 128, 384, 98304]`.
    pub fn int_list<T: std::str::FromStr>(&mut self, what: &str) -> Result<Vec<T>, ParseError> {
        self.punct('[')?;
        let mut out = Vec::new();
        if self.eat_punct(']')? {
            return Ok(out);
        }
        loop {
            out.push(self.int(what)?);
            if self.eat_punct(']')? {
                return Ok(out);
            }
            if !self.eat_punct(',')? {
                return Err(self.expected("`,` or `]`"));
            }
        }
    }

    /// An input kind as [`input_kind`] writes it.
    pub fn input_kind(&mut self) -> Result<Input, ParseError> {
        let what = "an input kind (tokens, positions, output ids, weight, data, K cache of layer N, V cache of layer N)";
        let (w, col) = self.word(what)?;
        Ok(match w {
            "tokens" => Input::Tokens,
            "positions" => Input::Positions,
            "output" => {
                self.keyword("ids")?;
                Input::OutputIds
            }
            "weight" => Input::Weight,
            "data" => Input::Data,
            "K" | "V" => {
                self.keyword("cache")?;
                self.keyword("of")?;
                self.keyword("layer")?;
                let layer = self.int("a layer number")?;
                let kind = if w == "K" { KvKind::K } else { KvKind::V };
                Input::KvCache { layer, kind }
            }
            _ => return Err(self.err_at(col, format!("expected {what}, found `{w}`"))),
        })
    }
}

/// A dtype from its GGML name (`F32`, `q4_k`), if the IR has it.
pub(crate) fn parse_dtype(w: &str) -> Option<DType> {
    crate::ggml::GgmlType::from_name(w).and_then(DType::from_ggml)
}

/// A parameter value in `[key=value ...]`.
#[derive(Clone, Debug)]
pub(crate) enum PVal<'a> {
    /// A bare flag (`non-causal`).
    Flag,
    /// `key=word`.
    Word(&'a str),
    /// `key={…}`.
    Shape(Shape),
    /// `key=[…]`.
    List(Vec<u64>),
}

/// The parameters of an op, `[eps=1e-5]`, as written; each is taken by name once.
#[derive(Debug, Default)]
pub(crate) struct Params<'a> {
    items: Vec<(&'a str, PVal<'a>, usize, bool)>,
    /// Line number, for errors.
    line: usize,
    /// Column of the `[` (or where it would be).
    pub col: usize,
}

impl<'a> Params<'a> {
    /// No parameters, at `col` of `line`.
    pub fn none(line: usize, col: usize) -> Params<'a> {
        Params {
            items: Vec::new(),
            line,
            col,
        }
    }

    /// Reads `[k=v k=v flag …]` if the next token is `[`; else no parameters.
    pub fn read(c: &mut Cursor<'a>) -> Result<Params<'a>, ParseError> {
        let mut p = Params::none(c.line, c.col());
        if !c.eat_punct('[')? {
            return Ok(p);
        }
        loop {
            if c.eat_punct(']')? {
                return Ok(p);
            }
            let (key, col) = c.word("a parameter (`key=value`) or `]`")?;
            let val = if c.eat_punct('=')? {
                if c.is_punct('{')? {
                    PVal::Shape(c.shape()?)
                } else if c.is_punct('[')? {
                    PVal::List(c.int_list("a number")?)
                } else {
                    PVal::Word(c.word(&format!("a value for `{key}`"))?.0)
                }
            } else {
                PVal::Flag
            };
            if p.items.iter().any(|(k, ..)| *k == key) {
                return Err(c.err_at(col, format!("parameter `{key}` is given twice")));
            }
            p.items.push((key, val, col, false));
        }
    }

    fn err(&self, col: usize, msg: String) -> ParseError {
        ParseError::new(self.line, col, msg)
    }

    /// An error at column `col` of the parameters' line.
    pub fn error(&self, col: usize, msg: impl Into<String>) -> ParseError {
        ParseError::new(self.line, col, msg)
    }

    fn take(&mut self, key: &str) -> Option<(PVal<'a>, usize)> {
        let item = self.items.iter_mut().find(|(k, ..)| *k == key)?;
        item.3 = true;
        Some((item.1.clone(), item.2))
    }

    /// Whether flag `key` is present.
    pub fn flag(&mut self, key: &str) -> Result<bool, ParseError> {
        match self.take(key) {
            None => Ok(false),
            Some((PVal::Flag, _)) => Ok(true),
            Some((_, col)) => Err(self.err(col, format!("`{key}` is a flag and takes no value"))),
        }
    }

    fn word(&mut self, key: &str, what: &str) -> Result<Option<(&'a str, usize)>, ParseError> {
        match self.take(key) {
            None => Ok(None),
            Some((PVal::Word(w), col)) => Ok(Some((w, col))),
            Some((_, col)) => Err(self.err(col, format!("expected `{key}={what}`"))),
        }
    }

    /// An optional number parameter.
    pub fn opt_num<T: std::str::FromStr>(&mut self, key: &str) -> Result<Option<T>, ParseError> {
        match self.word(key, "a number")? {
            None => Ok(None),
            Some((w, col)) => w
                .parse::<T>()
                .map(Some)
                .map_err(|_| self.err(col, format!("expected a number for `{key}`, found `{w}`"))),
        }
    }

    /// A required number parameter of `op`.
    pub fn num<T: std::str::FromStr>(&mut self, key: &str, op: &str) -> Result<T, ParseError> {
        self.opt_num(key)?
            .ok_or_else(|| self.err(self.col, format!("{op} needs parameter `{key}=…`")))
    }

    /// A required word parameter of `op`.
    pub fn text(&mut self, key: &str, op: &str) -> Result<(&'a str, usize), ParseError> {
        self.word(key, "a word")?
            .ok_or_else(|| self.err(self.col, format!("{op} needs parameter `{key}=…`")))
    }

    /// A required shape parameter of `op`.
    pub fn shape(&mut self, key: &str, op: &str) -> Result<Shape, ParseError> {
        match self.take(key) {
            Some((PVal::Shape(s), _)) => Ok(s),
            Some((_, col)) => Err(self.err(col, format!("expected `{key}={{…}}` (a shape)"))),
            None => Err(self.err(self.col, format!("{op} needs parameter `{key}={{…}}`"))),
        }
    }

    /// A required list parameter of `op` with exactly `n` entries.
    pub fn list(&mut self, key: &str, op: &str, n: usize) -> Result<Vec<u64>, ParseError> {
        match self.take(key) {
            Some((PVal::List(l), col)) => {
                if l.len() != n {
                    return Err(
                        self.err(col, format!("`{key}` needs {n} entries, found {}", l.len()))
                    );
                }
                Ok(l)
            }
            Some((_, col)) => Err(self.err(col, format!("expected `{key}=[…]` (a list)"))),
            None => Err(self.err(self.col, format!("{op} needs parameter `{key}=[…]`"))),
        }
    }

    /// Fails on a parameter nobody took.
    pub fn finish(&self, op: &str) -> Result<(), ParseError> {
        match self.items.iter().find(|i| !i.3) {
            Some((k, _, col, _)) => Err(self.err(*col, format!("{op} has no parameter `{k}`"))),
            None => Ok(()),
        }
    }
}

/// Splits `text` into numbered lines (1-based).
pub(crate) fn lines(text: &str) -> impl Iterator<Item = (usize, &str)> {
    text.split('\n').enumerate().map(|(i, l)| (i + 1, l))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_quote_when_needed() {
        assert_eq!(name("blk.0.attn_q.weight"), "blk.0.attn_q.weight");
        assert_eq!(name("Qcur-0,Kcur-0"), "\"Qcur-0,Kcur-0\"");
        assert_eq!(name("%3"), "\"%3\"");
        assert_eq!(name(""), "\"\"");
        assert_eq!(name("a b"), "\"a b\"");
    }

    #[test]
    fn lexer_reads_words_strings_and_comments() {
        let mut c = Cursor::new(r#"k1 "a,b" {64, kv≤256} ; comment"#, 1);
        assert_eq!(c.word("w").map(|w| w.0), Ok("k1"));
        assert_eq!(c.name("n").map(|n| n.0), Ok("a,b".to_string()));
        let s = c.shape().expect("shape");
        assert_eq!(s, Shape::new(&[64, 256]).with_kv_dim(1));
        assert!(c.at_end());
        let e = Cursor::new("{64, x}", 7).shape().expect_err("bad dim");
        assert_eq!((e.line, e.col), (7, 6));
        assert!(Cursor::new("\"open", 1).next().is_err());
    }
}
