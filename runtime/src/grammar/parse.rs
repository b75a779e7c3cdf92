//! The GBNF reader: grammar text → [`Grammar`] (rules of [`Elem`]s), with llama.cpp's syntax
//! and rewriting (`src/llama-grammar.cpp`, `llama_grammar_parser`): rules `name ::= ...`,
//! alternatives `|`, literals `"..."` with `\x \u \U \t \r \n \\ \" \[ \] \-` escapes, char
//! classes `[...]` / `[^...]` with ranges, `.`, groups `( )`, `* + ?`, `{m}`, `{m,}`,
//! `{m,n}`, `#` comments, and token references `<[id]>`, `<text>` (one token of the
//! vocabulary), `!<...>` (any token but that one).
//!
//! Groups become generated rules named `NAME_ID`; repetitions are rewritten as llama.cpp
//! rewrites them (`S{m,n}` → S repeated m times, then n-m nested optional rules), so the rule
//! list matches llama.cpp's element for element. After reading, every referenced rule must be
//! defined, `root` must exist and no rule may be left-recursive (llama.cpp's check).
//! Errors are one line naming the line and column.

use std::collections::HashMap;
use std::fmt;

/// llama.cpp's `MAX_REPETITION_THRESHOLD`: repetitions above it (times the rules they copy)
/// are refused.
const MAX_REPETITION: u64 = 2000;

/// Most rule nesting the left-recursion check follows (a guard against stack exhaustion).
const MAX_DEPTH: usize = 10_000;

/// Most nesting of parentheses the reader follows (a guard against stack exhaustion).
const MAX_GROUP_DEPTH: usize = 500;

/// One element of a rule (llama.cpp's `llama_grammar_element`). A rule is a list of
/// alternatives separated by [`Elem::Alt`] and closed by [`Elem::End`]; a char class is a
/// [`Elem::Char`] / [`Elem::CharNot`] / [`Elem::Any`] followed by [`Elem::CharAlt`] and
/// [`Elem::RngUpper`] elements (a `RngUpper` makes the char before it a range's lower end).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Elem {
    /// End of the rule.
    End,
    /// Start of another alternative.
    Alt,
    /// A reference to the rule with this id.
    RuleRef(u32),
    /// A code point (or the first of a positive class).
    Char(u32),
    /// The first code point of a negated class `[^...]`.
    CharNot(u32),
    /// The upper end (inclusive) of a range whose lower end is the element before.
    RngUpper(u32),
    /// Another code point of the class.
    CharAlt(u32),
    /// `.`: any code point.
    Any,
    /// Exactly this token id.
    Token(u32),
    /// Any token but this id.
    TokenNot(u32),
}

impl Elem {
    /// Whether this element ends an alternative (`End` or `Alt`).
    pub fn ends_alternative(self) -> bool {
        matches!(self, Elem::End | Elem::Alt)
    }
}

/// A parsed grammar: rules indexed by symbol id, their names, and the start rule.
#[derive(Clone, Debug)]
pub struct Grammar {
    /// Each rule's elements, ending with [`Elem::End`]; indexed by symbol id.
    pub rules: Vec<Vec<Elem>>,
    /// Each symbol's name (generated rules: `BASE_ID`).
    pub names: Vec<String>,
    /// The id of `root`.
    pub root: u32,
}

/// A grammar that cannot be used: what is wrong and where (1-based line and column; 0 when
/// the error is not at one place).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GrammarError {
    /// 1-based line (0: the grammar as a whole).
    pub line: usize,
    /// 1-based column, in characters.
    pub column: usize,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for GrammarError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.line == 0 {
            write!(f, "grammar: {}", self.message)
        } else {
            write!(
                f,
                "grammar, line {}, column {}: {}",
                self.line, self.column, self.message
            )
        }
    }
}

impl std::error::Error for GrammarError {}

/// Turns `<text>` into its token id: `Some(id)` when the text is exactly one token.
pub type TokenLookup<'a> = &'a dyn Fn(&str) -> Option<u32>;

impl Grammar {
    /// Reads GBNF `text` with `root` as the start rule. `<text>` token references need
    /// `lookup` (a vocabulary); `<[id]>` does not.
    ///
    /// # Errors
    /// The first syntax error, an undefined rule (at its first reference), a missing `root`,
    /// a left-recursive rule, or a repetition above llama.cpp's limit; one line each.
    pub fn parse(text: &str, lookup: Option<TokenLookup<'_>>) -> Result<Grammar, GrammarError> {
        let mut p = Parser {
            src: text.as_bytes(),
            text,
            symbols: HashMap::new(),
            names: Vec::new(),
            first_ref: Vec::new(),
            defined_at: Vec::new(),
            rules: Vec::new(),
            lookup,
            depth: 0,
        };
        let mut pos = p.space(0, true);
        while pos < p.src.len() {
            pos = p.rule(pos)?;
        }
        let n = p.names.len();
        p.rules.resize(n, Vec::new());
        for id in 0..n {
            if p.rules[id].is_empty() {
                let at = p.first_ref[id].unwrap_or(0);
                return Err(p.err(at, format!("undefined rule '{}'", p.names[id])));
            }
        }
        let Some(&root) = p.symbols.get("root") else {
            return Err(GrammarError {
                line: 0,
                column: 0,
                message: "there is no 'root' rule".into(),
            });
        };
        let g = Grammar {
            rules: p.rules,
            names: p.names,
            root,
        };
        if let Some(id) = g.left_recursive_rule()? {
            // llama.cpp names the rule its search started from; this names the rule that
            // reaches itself.
            let at = p.defined_at[id].unwrap_or(0);
            let (line, column) = line_col(text, at);
            return Err(GrammarError {
                line,
                column,
                message: format!(
                    "rule '{}' is left-recursive (llama.cpp's grammars do not support it)",
                    g.names[id]
                ),
            });
        }
        Ok(g)
    }

    /// The first rule (by id) that can reach itself without consuming input
    /// (llama.cpp's `llama_grammar_detect_left_recursion`, same visiting order).
    fn left_recursive_rule(&self) -> Result<Option<usize>, GrammarError> {
        let n = self.rules.len();
        let mut st = LeftRec {
            rules: &self.rules,
            visited: vec![false; n],
            in_progress: vec![false; n],
            may_be_empty: vec![false; n],
            cycle_at: None,
        };
        for i in 0..n {
            if st.visited[i] {
                continue;
            }
            if st.detect(i, 0)? {
                return Ok(Some(st.cycle_at.unwrap_or(i)));
            }
        }
        Ok(None)
    }
}

struct LeftRec<'a> {
    rules: &'a [Vec<Elem>],
    visited: Vec<bool>,
    in_progress: Vec<bool>,
    may_be_empty: Vec<bool>,
    /// The rule found reaching itself.
    cycle_at: Option<usize>,
}

impl LeftRec<'_> {
    fn detect(&mut self, i: usize, depth: usize) -> Result<bool, GrammarError> {
        if depth > MAX_DEPTH {
            return Err(GrammarError {
                line: 0,
                column: 0,
                message: format!("rules nest more than {MAX_DEPTH} deep"),
            });
        }
        if self.in_progress[i] {
            self.cycle_at.get_or_insert(i);
            return Ok(true);
        }
        self.in_progress[i] = true;
        let rule = &self.rules[i];
        let mut at_start = true;
        for e in rule {
            if e.ends_alternative() {
                if at_start {
                    self.may_be_empty[i] = true;
                    break;
                }
                at_start = true;
            } else {
                at_start = false;
            }
        }
        let mut leftmost = true;
        for &e in rule {
            match e {
                Elem::RuleRef(r) if leftmost => {
                    let r = r as usize;
                    if self.detect(r, depth + 1)? {
                        return Ok(true);
                    }
                    if !self.may_be_empty[r] {
                        leftmost = false;
                    }
                }
                e if e.ends_alternative() => leftmost = true,
                _ => leftmost = false,
            }
        }
        self.in_progress[i] = false;
        self.visited[i] = true;
        Ok(false)
    }
}

/// 1-based line and column (in characters) of byte offset `at`.
fn line_col(text: &str, at: usize) -> (usize, usize) {
    let at = at.min(text.len());
    let before = text.get(..at).unwrap_or(text);
    let line = before.matches('\n').count() + 1;
    let col = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, col)
}

struct Parser<'a> {
    src: &'a [u8],
    text: &'a str,
    symbols: HashMap<String, u32>,
    names: Vec<String>,
    /// Where each symbol was first referenced (for "undefined rule").
    first_ref: Vec<Option<usize>>,
    /// Where each symbol was defined.
    defined_at: Vec<Option<usize>>,
    rules: Vec<Vec<Elem>>,
    lookup: Option<TokenLookup<'a>>,
    /// Parentheses open around the current position.
    depth: usize,
}

fn is_word(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'-'
}

impl Parser<'_> {
    fn at(&self, pos: usize) -> u8 {
        self.src.get(pos).copied().unwrap_or(0)
    }

    fn err(&self, at: usize, message: impl Into<String>) -> GrammarError {
        let (line, column) = line_col(self.text, at);
        GrammarError {
            line,
            column,
            message: message.into(),
        }
    }

    /// An error at `at` saying what was expected and what is there.
    fn expecting(&self, at: usize, what: &str) -> GrammarError {
        let found = match self.text.get(at..).and_then(|s| s.chars().next()) {
            None => "the end of the grammar".to_string(),
            Some(c) => format!("{c:?}"),
        };
        self.err(at, format!("expecting {what}, found {found}"))
    }

    fn symbol(&mut self, name: &str) -> u32 {
        if let Some(&id) = self.symbols.get(name) {
            return id;
        }
        self.new_symbol(name.to_string())
    }

    fn new_symbol(&mut self, name: String) -> u32 {
        let id = self.names.len() as u32;
        self.symbols.insert(name.clone(), id);
        self.names.push(name);
        self.first_ref.push(None);
        self.defined_at.push(None);
        id
    }

    /// llama.cpp's `generate_symbol_id`: `BASE_ID`.
    fn generated(&mut self, base: &str) -> u32 {
        let id = self.names.len();
        self.new_symbol(format!("{base}_{id}"))
    }

    fn add_rule(&mut self, id: u32, rule: Vec<Elem>) {
        let id = id as usize;
        if self.rules.len() <= id {
            self.rules.resize(id + 1, Vec::new());
        }
        self.rules[id] = rule;
    }

    fn space(&self, mut pos: usize, newline_ok: bool) -> usize {
        loop {
            match self.at(pos) {
                b' ' | b'\t' => pos += 1,
                b'\r' | b'\n' if newline_ok => pos += 1,
                b'#' => {
                    while !matches!(self.at(pos), 0 | b'\r' | b'\n') {
                        pos += 1;
                    }
                }
                _ => return pos,
            }
        }
    }

    fn name_end(&self, pos: usize) -> Result<usize, GrammarError> {
        let mut end = pos;
        while is_word(self.at(end)) {
            end += 1;
        }
        if end == pos {
            return Err(self.expecting(pos, "a rule name"));
        }
        Ok(end)
    }

    fn int(&self, pos: usize) -> Result<(u64, usize), GrammarError> {
        let mut end = pos;
        while self.at(end).is_ascii_digit() {
            end += 1;
        }
        if end == pos {
            return Err(self.expecting(pos, "an integer"));
        }
        let s = self.text.get(pos..end).unwrap_or("");
        let n = s
            .parse::<u64>()
            .map_err(|_| self.err(pos, format!("the integer {s} is too large")))?;
        Ok((n, end))
    }

    fn hex(&self, pos: usize, size: usize) -> Result<(u32, usize), GrammarError> {
        let digits = self
            .src
            .get(pos..pos + size)
            .filter(|d| d.iter().all(u8::is_ascii_hexdigit));
        let Some(digits) = digits else {
            return Err(self.err(pos, format!("expecting {size} hex digits")));
        };
        let mut v: u32 = 0;
        for &d in digits {
            let x = (d as char).to_digit(16).unwrap_or(0);
            v = v.wrapping_shl(4) | x;
        }
        Ok((v, pos + size))
    }

    /// One character of a literal or class: an escape or a UTF-8 character.
    fn char(&self, pos: usize) -> Result<(u32, usize), GrammarError> {
        if self.at(pos) == b'\\' {
            return match self.at(pos + 1) {
                b'x' => self.hex(pos + 2, 2),
                b'u' => self.hex(pos + 2, 4),
                b'U' => self.hex(pos + 2, 8),
                b't' => Ok((u32::from('\t'), pos + 2)),
                b'r' => Ok((u32::from('\r'), pos + 2)),
                b'n' => Ok((u32::from('\n'), pos + 2)),
                c @ (b'\\' | b'"' | b'[' | b']' | b'-') => Ok((u32::from(c), pos + 2)),
                _ => Err(self.err(pos, "unknown escape")),
            };
        }
        match self.text.get(pos..).and_then(|s| s.chars().next()) {
            Some(c) => Ok((u32::from(c), pos + c.len_utf8())),
            None => Err(self.err(pos, "unexpected end of the grammar")),
        }
    }

    fn token(&self, pos: usize) -> Result<(u32, usize), GrammarError> {
        // self.at(pos) == '<'
        let start = pos;
        let mut pos = pos + 1;
        if self.at(pos) == b'[' {
            let (id, end) = self.int(pos + 1)?;
            let id = u32::try_from(id)
                .map_err(|_| self.err(pos + 1, format!("token id {id} is too large")))?;
            if self.at(end) != b']' {
                return Err(self.expecting(end, "']'"));
            }
            if self.at(end + 1) != b'>' {
                return Err(self.expecting(end + 1, "'>'"));
            }
            return Ok((id, end + 2));
        }
        while !matches!(self.at(pos), 0 | b'>') {
            pos += 1;
        }
        if self.at(pos) != b'>' {
            return Err(self.expecting(pos, "'>'"));
        }
        let text = self.text.get(start..=pos).unwrap_or("");
        let Some(lookup) = self.lookup else {
            return Err(self.err(
                start,
                format!("token {text}: no vocabulary to look it up in"),
            ));
        };
        match lookup(text) {
            Some(id) => Ok((id, pos + 1)),
            None => Err(self.err(start, format!("{text} is not one token of the vocabulary"))),
        }
    }

    fn rule(&mut self, pos: usize) -> Result<usize, GrammarError> {
        let name_end = self.name_end(pos)?;
        let name = self.text.get(pos..name_end).unwrap_or("").to_string();
        let id = self.symbol(&name);
        if self.defined_at[id as usize].is_none() {
            self.defined_at[id as usize] = Some(pos);
        }
        let p = self.space(name_end, false);
        if self.src.get(p..p + 3) != Some(b"::=") {
            return Err(self.expecting(p, "'::='"));
        }
        let p = self.space(p + 3, true);
        let p = self.alternates(p, &name, id, false)?;
        let p = match self.at(p) {
            b'\r' if self.at(p + 1) == b'\n' => p + 2,
            b'\r' | b'\n' => p + 1,
            _ if p >= self.src.len() => p,
            _ => return Err(self.expecting(p, "a newline or the end")),
        };
        Ok(self.space(p, true))
    }

    fn alternates(
        &mut self,
        pos: usize,
        name: &str,
        id: u32,
        nested: bool,
    ) -> Result<usize, GrammarError> {
        let mut rule = Vec::new();
        let mut pos = self.sequence(pos, name, &mut rule, nested)?;
        while self.at(pos) == b'|' {
            rule.push(Elem::Alt);
            pos = self.space(pos + 1, true);
            pos = self.sequence(pos, name, &mut rule, nested)?;
        }
        rule.push(Elem::End);
        self.add_rule(id, rule);
        Ok(pos)
    }

    /// llama.cpp's repetition rewrite of the last item of `rule` (from `last`): `S{m,n}` →
    /// S m times, then n-m nested rules `S' ::= S S'' |`; `S{m,}` → S m times, then
    /// `S' ::= S S' |`.
    #[allow(clippy::too_many_arguments)]
    fn repeat(
        &mut self,
        at: usize,
        name: &str,
        rule: &mut Vec<Elem>,
        last: usize,
        n_prev_rules: &mut u64,
        min: u64,
        max: Option<u64>,
    ) -> Result<(), GrammarError> {
        if last == rule.len() {
            return Err(self.err(at, "expecting an item before */+/?/{"));
        }
        if let Some(max) = max {
            if max < min {
                return Err(self.err(
                    at,
                    format!("repetition {{{min},{max}}}: the maximum is below the minimum"),
                ));
            }
        }
        let prev: Vec<Elem> = rule[last..].to_vec();
        let total = match max {
            Some(m) if m > 0 => m,
            _ if min > 0 => min,
            _ => 1,
        };
        if n_prev_rules.saturating_mul(total) > MAX_REPETITION {
            return Err(self.err(
                at,
                format!("this repetition makes more than {MAX_REPETITION} copies of rules (llama.cpp's limit)"),
            ));
        }
        if min == 0 {
            rule.truncate(last);
        } else {
            for _ in 1..min {
                rule.extend_from_slice(&prev);
            }
        }
        let n_opt = match max {
            None => 1,
            Some(m) => m - min,
        };
        let mut last_rec = 0u32;
        for i in 0..n_opt {
            let mut rec = prev.clone();
            let rec_id = self.generated(name);
            if i > 0 || max.is_none() {
                rec.push(Elem::RuleRef(if max.is_none() { rec_id } else { last_rec }));
            }
            rec.push(Elem::Alt);
            rec.push(Elem::End);
            self.add_rule(rec_id, rec);
            last_rec = rec_id;
        }
        if n_opt > 0 {
            rule.push(Elem::RuleRef(last_rec));
        }
        *n_prev_rules = n_prev_rules.saturating_mul(total);
        Ok(())
    }

    fn sequence(
        &mut self,
        mut pos: usize,
        name: &str,
        rule: &mut Vec<Elem>,
        nested: bool,
    ) -> Result<usize, GrammarError> {
        let mut last = rule.len();
        let mut n_prev_rules: u64 = 1;
        while pos < self.src.len() {
            let c = self.at(pos);
            match c {
                b'"' => {
                    pos += 1;
                    last = rule.len();
                    n_prev_rules = 1;
                    while self.at(pos) != b'"' {
                        if pos >= self.src.len() {
                            return Err(self.err(pos, "unterminated literal: expecting '\"'"));
                        }
                        let (ch, next) = self.char(pos)?;
                        rule.push(Elem::Char(ch));
                        pos = next;
                    }
                    pos = self.space(pos + 1, nested);
                }
                b'[' => {
                    let open = pos;
                    pos += 1;
                    let negated = self.at(pos) == b'^';
                    if negated {
                        pos += 1;
                    }
                    last = rule.len();
                    n_prev_rules = 1;
                    while self.at(pos) != b']' {
                        if pos >= self.src.len() {
                            return Err(
                                self.err(open, "unterminated character class: expecting ']'")
                            );
                        }
                        let (ch, next) = self.char(pos)?;
                        pos = next;
                        rule.push(if last < rule.len() {
                            Elem::CharAlt(ch)
                        } else if negated {
                            Elem::CharNot(ch)
                        } else {
                            Elem::Char(ch)
                        });
                        if self.at(pos) == b'-' && self.at(pos + 1) != b']' {
                            if pos + 1 >= self.src.len() {
                                return Err(self.err(pos + 1, "unexpected end of the grammar"));
                            }
                            let (hi, next) = self.char(pos + 1)?;
                            pos = next;
                            rule.push(Elem::RngUpper(hi));
                        }
                    }
                    pos = self.space(pos + 1, nested);
                }
                b'<' | b'!' => {
                    let not = c == b'!';
                    let start = if not { pos + 1 } else { pos };
                    if self.at(start) != b'<' {
                        return Err(self.expecting(start, "'<'"));
                    }
                    let (id, end) = self.token(start)?;
                    last = rule.len();
                    n_prev_rules = 1;
                    rule.push(if not {
                        Elem::TokenNot(id)
                    } else {
                        Elem::Token(id)
                    });
                    pos = self.space(end, nested);
                }
                c if is_word(c) => {
                    let end = self.name_end(pos)?;
                    let ref_name = self.text.get(pos..end).unwrap_or("").to_string();
                    let id = self.symbol(&ref_name);
                    self.first_ref[id as usize].get_or_insert(pos);
                    pos = self.space(end, nested);
                    last = rule.len();
                    n_prev_rules = 1;
                    rule.push(Elem::RuleRef(id));
                }
                b'(' => {
                    let open = pos;
                    if self.depth >= MAX_GROUP_DEPTH {
                        return Err(self.err(
                            open,
                            format!("parentheses nest more than {MAX_GROUP_DEPTH} deep"),
                        ));
                    }
                    self.depth += 1;
                    pos = self.space(pos + 1, true);
                    let before = self.names.len() as u64;
                    let sub = self.generated(name);
                    pos = self.alternates(pos, name, sub, true)?;
                    self.depth -= 1;
                    n_prev_rules = (self.names.len() as u64 - before).max(1);
                    last = rule.len();
                    rule.push(Elem::RuleRef(sub));
                    if self.at(pos) != b')' {
                        let mut e = self.expecting(pos, "')'");
                        let (l, c) = line_col(self.text, open);
                        e.message =
                            format!("{} (to close the '(' of line {l}, column {c})", e.message);
                        return Err(e);
                    }
                    pos = self.space(pos + 1, nested);
                }
                b'.' => {
                    last = rule.len();
                    n_prev_rules = 1;
                    rule.push(Elem::Any);
                    pos = self.space(pos + 1, nested);
                }
                b'*' | b'+' | b'?' => {
                    let at = pos;
                    pos = self.space(pos + 1, nested);
                    let (min, max) = match c {
                        b'*' => (0, None),
                        b'+' => (1, None),
                        _ => (0, Some(1)),
                    };
                    self.repeat(at, name, rule, last, &mut n_prev_rules, min, max)?;
                }
                b'{' => {
                    let at = pos;
                    pos = self.space(pos + 1, nested);
                    if !self.at(pos).is_ascii_digit() {
                        return Err(self.expecting(pos, "an integer"));
                    }
                    let (min, end) = self.int(pos)?;
                    pos = self.space(end, nested);
                    let mut max = None;
                    match self.at(pos) {
                        b'}' => {
                            max = Some(min);
                            pos = self.space(pos + 1, nested);
                        }
                        b',' => {
                            pos = self.space(pos + 1, nested);
                            if self.at(pos).is_ascii_digit() {
                                let (m, end) = self.int(pos)?;
                                max = Some(m);
                                pos = self.space(end, nested);
                            }
                            if self.at(pos) != b'}' {
                                return Err(self.expecting(pos, "'}'"));
                            }
                            pos = self.space(pos + 1, nested);
                        }
                        _ => return Err(self.expecting(pos, "',' or '}'")),
                    }
                    if min > MAX_REPETITION {
                        return Err(self.err(
                            at,
                            format!("{min} repetitions: more than llama.cpp's limit of {MAX_REPETITION}"),
                        ));
                    }
                    if max.is_some_and(|m| m > MAX_REPETITION) {
                        max = None;
                    }
                    self.repeat(at, name, rule, last, &mut n_prev_rules, min, max)?;
                }
                _ => break,
            }
        }
        Ok(pos)
    }
}

/// Prints a code point as llama.cpp's `print_grammar_char` does (printable ASCII as is,
/// others as `<U+XXXX>`).
fn print_char(out: &mut String, c: u32) {
    match char::from_u32(c) {
        Some(ch) if (0x20..=0x7f).contains(&c) => out.push(ch),
        _ => out.push_str(&format!("<U+{c:04X}>")),
    }
}

impl fmt::Display for Grammar {
    /// The rules in llama.cpp's `llama_grammar_parser::print` form, one per line in id order.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (id, rule) in self.rules.iter().enumerate() {
            let mut s = format!("{} ::= ", self.names[id]);
            let n = rule.len().saturating_sub(1);
            for (i, &e) in rule.iter().take(n).enumerate() {
                match e {
                    Elem::End => {}
                    Elem::Alt => s.push_str("| "),
                    Elem::RuleRef(r) => {
                        s.push_str(self.names.get(r as usize).map_or("?", |x| x.as_str()));
                        s.push(' ');
                    }
                    Elem::Char(c) => {
                        s.push('[');
                        print_char(&mut s, c);
                    }
                    Elem::CharNot(c) => {
                        s.push_str("[^");
                        print_char(&mut s, c);
                    }
                    Elem::RngUpper(c) => {
                        s.push('-');
                        print_char(&mut s, c);
                    }
                    Elem::CharAlt(c) => print_char(&mut s, c),
                    Elem::Any => s.push('.'),
                    Elem::Token(t) => s.push_str(&format!("<[{t}]> ")),
                    Elem::TokenNot(t) => s.push_str(&format!("!<[{t}]> ")),
                }
                let in_class = matches!(
                    e,
                    Elem::Char(_)
                        | Elem::CharNot(_)
                        | Elem::RngUpper(_)
                        | Elem::CharAlt(_)
                        | Elem::Any
                );
                let next_in_class = matches!(
                    rule.get(i + 1),
                    Some(Elem::CharAlt(_) | Elem::RngUpper(_) | Elem::Any)
                );
                if in_class && !next_in_class {
                    s.push_str("] ");
                }
            }
            writeln!(f, "{s}")?;
        }
        Ok(())
    }
}
