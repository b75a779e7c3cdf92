//! Splitting text into pre-tokenized words: llama.cpp's `unicode_regex_split`.
//!
//! A pre-tokenizer is a list of expressions applied in order; each one splits every piece the
//! previous ones produced into its matches and the gaps between them (both kept). llama.cpp
//! runs the GPT-2 and Llama-3 expressions (and Kimi-K2's and AFMoE's) with hand-written
//! splitters, and every other one with `std::regex` in the ECMAScript dialect, on one of two
//! views of the text:
//!
//! - **collapsed** (the expression uses `\p{N}`, `\p{L}`, `\p{P}`, `\p{M}`, `\p{S}` or a
//!   letter subcategory): every code point at or above U+0080 becomes one byte standing for its
//!   class (white space → U+000B, number, letter, punctuation, mark, symbol, anything else), and
//!   `\p{X}` becomes "that byte or the ASCII members of X" — so `\p{S}` misses `~`, a quirk
//!   kept here;
//! - **wide** (no category in the expression): the code points themselves, with non-ASCII white
//!   space replaced by U+000B.
//!
//! `\s`, `\d`, `\w` and `\b` are ASCII-only there (`std::regex` in the C locale). This module
//! builds the same views and translates each expression to `fancy-regex` syntax with those
//! meanings, so matches are the same; the hand-written splitters are ported from
//! llama.cpp's logic. Two extra hand-written splitters (Qwen2's expression, and `\p{N}` alone,
//! used by StarCoder/SmolLM-style pre-tokenizers) replace the general engine where it is
//! slow; tests check them against the general engine on random text.
//!
//! One known difference: after an empty match `std::regex_iterator` retries a non-empty match
//! at the same position; here the search moves on one code point. Only expressions that can
//! match the empty string are affected (superbpe's digit-grouping lookahead, which cannot
//! match non-empty).

use super::pre::{AFMOE_DIGITS_RE, GPT2_RE, KIMI_K2_RE, LLAMA3_RE, QWEN2_RE};
use super::unicode::{flags, Category, Flags};
use std::ops::Range;

/// How one expression is run.
#[derive(Debug)]
enum Stage {
    Gpt2,
    Llama3,
    Qwen2,
    EachNumber,
    KimiK2,
    AfmoeDigits,
    Regex {
        re: Box<fancy_regex::Regex>,
        collapsed: bool,
    },
}

/// A compiled pre-tokenizer: split expressions plus whether words are mapped through the GPT-2
/// byte alphabet afterwards.
#[derive(Debug)]
pub struct Splitter {
    stages: Vec<Stage>,
}

/// Which splitters replace the general engine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Level {
    /// Only the general engine (tests).
    #[cfg_attr(not(test), allow(dead_code))]
    General,
    /// llama.cpp's own hand-written splitters.
    LlamaCpp,
    /// llama.cpp's plus modelc's equivalent fast paths.
    Fast,
}

/// The original (case-insensitive group) spelling of Llama 3's expression, which llama.cpp
/// also routes to its custom splitter.
const LLAMA3_RE_ORIGINAL: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// White space for `\s` in `std::regex` (C locale): ASCII only; non-ASCII white space reaches
/// the expression as U+000B in both views.
const WS_CLASS: &str = r"\t\n\x0B\x0C\r\x20";
const WORD_CLASS: &str = "0-9A-Za-z_";
/// `\b` with ASCII word characters, as lookarounds.
const ASCII_WORD_BOUNDARY: &str =
    "(?:(?<=[0-9A-Za-z_])(?![0-9A-Za-z_])|(?<![0-9A-Za-z_])(?=[0-9A-Za-z_]))";

/// Stand-ins of the collapsed view (llama.cpp `k_ucat_cpt`), as chars.
const COLLAPSED_OTHER: char = '\u{D0}';
const COLLAPSED_NUMBER: char = '\u{D1}';
const COLLAPSED_LETTER: char = '\u{D2}';
const COLLAPSED_PUNCT: char = '\u{D3}';
const COLLAPSED_MARK: char = '\u{D4}';
const COLLAPSED_SYMBOL: char = '\u{D5}';

/// The category names that switch an expression to the collapsed view (llama.cpp `k_ucat_enum`).
const CATEGORY_NAMES: [&str; 10] = ["N", "L", "P", "M", "S", "Lu", "Ll", "Lt", "Lm", "Lo"];

fn collapsed_class(name: &str) -> Option<&'static str> {
    Some(match name {
        "N" => r"\x{D1}0-9",
        "L" | "Lu" | "Ll" | "Lt" | "Lm" | "Lo" => r"\x{D2}A-Za-z",
        "P" => r"\x{D3}!-#%-*,-/:-;?-@\[-\]_\{\}",
        "M" => r"\x{D4}",
        "S" => r"\x{D5}\$\+<->\^`\|",
        _ => return None,
    })
}

fn uses_categories(expr: &str) -> bool {
    CATEGORY_NAMES
        .iter()
        .any(|n| expr.contains(&format!("\\p{{{n}}}")))
}

/// Translates an expression from llama.cpp's ECMAScript form to `fancy-regex` syntax with the
/// meanings described in the module docs.
fn translate(expr: &str, collapsed: bool) -> Result<String, String> {
    let chars: Vec<char> = expr.chars().collect();
    let mut out = String::with_capacity(expr.len() * 2);
    let mut inside = false;
    let mut i = 0;
    let wrap = |out: &mut String, inside: bool, body: &str| {
        if inside {
            out.push_str(body);
        } else {
            out.push('[');
            out.push_str(body);
            out.push(']');
        }
    };
    while i < chars.len() {
        let c = chars[i];
        if c == '\\' {
            let e = *chars.get(i + 1).ok_or("expression ends with a backslash")?;
            i += 2;
            match e {
                'p' => {
                    if chars.get(i) != Some(&'{') {
                        return Err("\\p without {".into());
                    }
                    let close = chars[i..]
                        .iter()
                        .position(|&c| c == '}')
                        .ok_or("\\p{ without }")?;
                    let name: String = chars[i + 1..i + close].iter().collect();
                    i += close + 1;
                    if !collapsed {
                        return Err(format!("\\p{{{name}}} outside the collapsed view"));
                    }
                    let class = collapsed_class(&name)
                        .ok_or_else(|| format!("unsupported category \\p{{{name}}}"))?;
                    wrap(&mut out, inside, class);
                }
                's' => wrap(&mut out, inside, WS_CLASS),
                'S' if !inside => {
                    out.push_str("[^");
                    out.push_str(WS_CLASS);
                    out.push(']');
                }
                'd' => wrap(&mut out, inside, "0-9"),
                'D' if !inside => out.push_str("[^0-9]"),
                'w' => wrap(&mut out, inside, WORD_CLASS),
                'W' if !inside => {
                    out.push_str("[^");
                    out.push_str(WORD_CLASS);
                    out.push(']');
                }
                'b' if !inside => out.push_str(ASCII_WORD_BOUNDARY),
                'S' | 'D' | 'W' | 'b' => {
                    return Err(format!("\\{e} inside a class is not supported"))
                }
                'r' | 'n' | 't' | 'f' | 'v' => {
                    out.push('\\');
                    out.push(e);
                }
                e if e.is_ascii_punctuation() => {
                    out.push('\\');
                    out.push(e);
                }
                e => return Err(format!("unsupported escape \\{e}")),
            }
            continue;
        }
        if collapsed && !c.is_ascii() {
            return Err("expression mixes unicode categories and non-ASCII characters".into());
        }
        if !inside && c == '[' {
            inside = true;
            out.push('[');
            if chars.get(i + 1) == Some(&'^') {
                out.push('^');
                i += 1;
            }
        } else if inside && c == ']' {
            inside = false;
            out.push(']');
        } else if inside && matches!(c, '[' | '&' | '~') {
            out.push('\\');
            out.push(c);
        } else {
            out.push(c);
        }
        i += 1;
    }
    if inside {
        return Err("unterminated character class".into());
    }
    Ok(out)
}

impl Splitter {
    /// Compiles a list of expressions. With `fast`, expressions that have an equivalent
    /// hand-written splitter use it; without, only llama.cpp's own custom splitters are used
    /// and everything else goes through the general engine (for testing the fast paths).
    ///
    /// Errors name the expression that could not be compiled.
    pub fn new(exprs: &[&str], fast: bool) -> Result<Splitter, String> {
        Self::with_level(exprs, if fast { Level::Fast } else { Level::LlamaCpp })
    }

    fn with_level(exprs: &[&str], level: Level) -> Result<Splitter, String> {
        let mut stages = Vec::with_capacity(exprs.len());
        for &expr in exprs {
            let custom = match expr {
                GPT2_RE => Some(Stage::Gpt2),
                LLAMA3_RE | LLAMA3_RE_ORIGINAL => Some(Stage::Llama3),
                KIMI_K2_RE => Some(Stage::KimiK2),
                AFMOE_DIGITS_RE => Some(Stage::AfmoeDigits),
                QWEN2_RE if level == Level::Fast => Some(Stage::Qwen2),
                r"\p{N}" if level == Level::Fast => Some(Stage::EachNumber),
                _ => None,
            };
            let stage = match custom {
                Some(s) if level != Level::General => s,
                _ => {
                    let collapsed = uses_categories(expr);
                    let pat = translate(expr, collapsed)
                        .map_err(|e| format!("pre-tokenizer expression '{expr}': {e}"))?;
                    let re = fancy_regex::RegexBuilder::new(&pat)
                        .backtrack_limit(100_000_000)
                        .build()
                        .map_err(|e| format!("pre-tokenizer expression '{expr}': {e}"))?;
                    Stage::Regex {
                        re: Box::new(re),
                        collapsed,
                    }
                }
            };
            stages.push(stage);
        }
        Ok(Splitter { stages })
    }

    /// Splits `text` into words, returned as byte ranges of `text` in order; together they
    /// cover the text exactly. Empty words are dropped (they produce no tokens).
    pub fn split(&self, text: &str) -> Vec<Range<usize>> {
        let cpts: Vec<char> = text.chars().collect();
        if cpts.is_empty() {
            return Vec::new();
        }
        let fl: Vec<Flags> = cpts.iter().map(|&c| flags(c)).collect();
        let mut offsets = vec![cpts.len()];
        for stage in &self.stages {
            let mut out = Vec::with_capacity(offsets.len() * 2);
            match stage {
                Stage::Gpt2 => split_gpt2(&cpts, &fl, &offsets, &mut out),
                Stage::Llama3 => split_llama3(&cpts, &fl, &offsets, &mut out, 3),
                Stage::Qwen2 => split_llama3(&cpts, &fl, &offsets, &mut out, 1),
                Stage::EachNumber => split_each_number(&fl, &offsets, &mut out),
                Stage::KimiK2 => split_kimi_k2(&cpts, &fl, &offsets, &mut out),
                Stage::AfmoeDigits => split_afmoe_digits(&fl, &offsets, &mut out),
                Stage::Regex { re, collapsed } => {
                    split_regex(re, *collapsed, &cpts, &fl, &offsets, &mut out)
                }
            }
            offsets = out;
        }
        let mut ranges = Vec::with_capacity(offsets.len());
        let mut byte = 0usize;
        let mut it = cpts.iter();
        for len in offsets {
            let start = byte;
            for c in it.by_ref().take(len) {
                byte += c.len_utf8();
            }
            if byte > start {
                ranges.push(start..byte);
            }
        }
        ranges
    }
}

/// Collects word lengths (in code points) for one segment; `emit(end)` closes the word that
/// runs from the previous end to `end`.
struct Emitter<'a> {
    out: &'a mut Vec<usize>,
    prev: usize,
}

impl Emitter<'_> {
    #[inline]
    fn emit(&mut self, end: usize) {
        if end > self.prev {
            self.out.push(end - self.prev);
        }
        self.prev = end;
    }
}

/// Iterates the segments `[ini, end)` described by `offsets`.
fn segments(offsets: &[usize]) -> impl Iterator<Item = (usize, usize)> + '_ {
    offsets.iter().scan(0usize, |start, &len| {
        let seg = (*start, *start + len);
        *start += len;
        Some(seg)
    })
}

fn is_contraction_tail(c: char) -> bool {
    matches!(c, 's' | 't' | 'm' | 'd')
}

fn is_contraction_pair(a: char, b: char) -> bool {
    matches!((a, b), ('r', 'e') | ('v', 'e') | ('l', 'l'))
}

/// GPT-2: `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)` (llama.cpp
/// `unicode_regex_split_custom_gpt2`).
fn split_gpt2(cpts: &[char], fl: &[Flags], offsets: &[usize], out: &mut Vec<usize>) {
    for (ini, end) in segments(offsets) {
        let fg = |p: usize| if p < end { fl[p] } else { Flags::NONE };
        let mut em = Emitter { out, prev: ini };
        let mut pos = ini;
        while pos < end {
            let c = cpts[pos];
            if c == '\'' && pos + 1 < end {
                let n = cpts[pos + 1];
                if is_contraction_tail(n) {
                    pos += 2;
                    em.emit(pos);
                    continue;
                }
                if pos + 2 < end && is_contraction_pair(n, cpts[pos + 2]) {
                    pos += 3;
                    em.emit(pos);
                    continue;
                }
            }
            let mut f2 = if c == ' ' { fg(pos + 1) } else { fl[pos] };
            if f2.is_letter() || f2.is_number() {
                let letter = f2.is_letter();
                pos += (c == ' ') as usize;
                while if letter {
                    f2.is_letter()
                } else {
                    f2.is_number()
                } {
                    pos += 1;
                    f2 = fg(pos);
                }
                em.emit(pos);
                continue;
            }
            let other =
                |f: Flags| !(f.is_whitespace() || f.is_letter() || f.is_number()) && f.is_some();
            if other(f2) {
                pos += (c == ' ') as usize;
                while other(f2) {
                    pos += 1;
                    f2 = fg(pos);
                }
                em.emit(pos);
                continue;
            }
            let mut n_ws = 0;
            while fg(pos + n_ws).is_whitespace() {
                n_ws += 1;
            }
            if n_ws > 1 && pos + n_ws < end {
                pos += n_ws - 1;
            } else if n_ws > 0 {
                pos += n_ws;
            } else {
                pos += 1;
            }
            em.emit(pos);
        }
    }
}

/// Llama 3 (`digits` = 3): `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
/// ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+` (llama.cpp
/// `unicode_regex_split_custom_llama3`); with `digits` = 1 the same with `\p{N}` (Qwen2).
fn split_llama3(
    cpts: &[char],
    fl: &[Flags],
    offsets: &[usize],
    out: &mut Vec<usize>,
    digits: usize,
) {
    for (ini, end) in segments(offsets) {
        let fg = |p: usize| if p < end { fl[p] } else { Flags::NONE };
        let cp = |p: usize| if p < end { Some(cpts[p]) } else { None };
        let mut em = Emitter { out, prev: ini };
        let mut pos = ini;
        while pos < end {
            let c = cpts[pos];
            let f = fl[pos];
            if c == '\'' && pos + 1 < end {
                let n = cpts[pos + 1].to_ascii_lowercase();
                if is_contraction_tail(n) {
                    pos += 2;
                    em.emit(pos);
                    continue;
                }
                if pos + 2 < end && is_contraction_pair(n, cpts[pos + 2].to_ascii_lowercase()) {
                    pos += 3;
                    em.emit(pos);
                    continue;
                }
            }
            // [^\r\n\p{L}\p{N}]?\p{L}+
            if !(c == '\r' || c == '\n' || f.is_number())
                && (f.is_letter() || fg(pos + 1).is_letter())
            {
                pos += 1;
                while fg(pos).is_letter() {
                    pos += 1;
                }
                em.emit(pos);
                continue;
            }
            // \p{N}{1,digits}
            if f.is_number() {
                let mut run_start = pos;
                while fg(pos).is_number() {
                    pos += 1;
                    if pos - run_start >= digits {
                        em.emit(pos);
                        run_start = pos;
                    }
                }
                em.emit(pos);
                continue;
            }
            // <space>?[^\s\p{L}\p{N}]+[\r\n]*
            let mut f2 = if c == ' ' { fg(pos + 1) } else { f };
            let other = |f: Flags| !(f.is_whitespace() || f.is_letter() || f.is_number());
            if other(f2) && f.is_some() {
                pos += (c == ' ') as usize;
                while other(f2) && f2.is_some() {
                    pos += 1;
                    f2 = fg(pos);
                }
                while matches!(cp(pos), Some('\r' | '\n')) {
                    pos += 1;
                }
                em.emit(pos);
                continue;
            }
            let mut n_ws = 0;
            let mut last_rn_end = 0;
            while fg(pos + n_ws).is_whitespace() {
                if matches!(cpts[pos + n_ws], '\r' | '\n') {
                    last_rn_end = pos + n_ws + 1;
                }
                n_ws += 1;
            }
            if last_rn_end > 0 {
                // \s*[\r\n]+
                pos = last_rn_end;
            } else if n_ws > 1 && pos + n_ws < end {
                // \s+(?!\S)
                pos += n_ws - 1;
            } else if n_ws > 0 {
                pos += n_ws;
            } else {
                pos += 1;
            }
            em.emit(pos);
        }
    }
}

/// `\p{N}` alone: every number code point is a word, and so is each run between them.
fn split_each_number(fl: &[Flags], offsets: &[usize], out: &mut Vec<usize>) {
    for (ini, end) in segments(offsets) {
        let mut em = Emitter { out, prev: ini };
        for (pos, f) in fl.iter().enumerate().take(end).skip(ini) {
            if f.is_number() {
                em.emit(pos);
                em.emit(pos + 1);
            }
        }
        em.emit(end);
    }
}

/// Han ideographs as llama.cpp's `unicode_cpt_is_han` lists them.
fn is_han(c: Option<char>) -> bool {
    let Some(c) = c else { return false };
    matches!(c as u32,
        0x4E00..=0x9FFF | 0x3400..=0x4DBF | 0x20000..=0x2A6DF | 0x2A700..=0x2B73F
        | 0x2B740..=0x2B81F | 0x2B820..=0x2CEAF | 0x2CEB0..=0x2EBEF | 0xF900..=0xFAFF
        | 0x2F800..=0x2FA1F)
}

/// Kimi-K2's rules (llama.cpp `unicode_regex_split_custom_kimi_k2`): Han runs, letter words
/// without Han with optional contraction, 1-3 digit groups, then as Llama 3.
fn split_kimi_k2(cpts: &[char], fl: &[Flags], offsets: &[usize], out: &mut Vec<usize>) {
    for (ini, end) in segments(offsets) {
        let fg = |p: usize| if p < end { fl[p] } else { Flags::NONE };
        let cp = |p: usize| if p < end { Some(cpts[p]) } else { None };
        let letter_not_han = |p: usize| fg(p).is_letter() && !is_han(cp(p));
        let mut em = Emitter { out, prev: ini };
        let mut pos = ini;
        while pos < end {
            let c = cpts[pos];
            let f = fl[pos];
            if is_han(Some(c)) {
                while is_han(cp(pos)) {
                    pos += 1;
                }
                em.emit(pos);
                continue;
            }
            let leading_ok = !(c == '\r' || c == '\n' || f.is_letter() || f.is_number());
            if (f.is_letter() && !is_han(Some(c))) || (leading_ok && letter_not_han(pos + 1)) {
                let mut has_leading = false;
                if leading_ok {
                    has_leading = true;
                    pos += 1;
                }
                let mut has_letters = false;
                while letter_not_han(pos) {
                    has_letters = true;
                    pos += 1;
                }
                if has_letters || (!has_leading && letter_not_han(pos)) {
                    if !has_letters {
                        pos += 1;
                    }
                    while letter_not_han(pos) {
                        pos += 1;
                    }
                    if cp(pos) == Some('\'') && pos + 1 < end {
                        let n = cpts[pos + 1].to_ascii_lowercase();
                        if is_contraction_tail(n) {
                            pos += 2;
                        } else if pos + 2 < end
                            && is_contraction_pair(n, cpts[pos + 2].to_ascii_lowercase())
                        {
                            pos += 3;
                        }
                    }
                    em.emit(pos);
                    continue;
                } else if has_leading {
                    pos -= 1;
                }
            }
            if f.is_number() {
                let mut run_start = pos;
                while fg(pos).is_number() {
                    pos += 1;
                    if pos - run_start >= 3 {
                        em.emit(pos);
                        run_start = pos;
                    }
                }
                em.emit(pos);
                continue;
            }
            let mut f2 = if c == ' ' { fg(pos + 1) } else { f };
            let other =
                |f: Flags| !(f.is_whitespace() || f.is_letter() || f.is_number()) && f.is_some();
            if other(f2) {
                pos += (c == ' ') as usize;
                while other(f2) {
                    pos += 1;
                    f2 = fg(pos);
                }
                while matches!(cp(pos), Some('\r' | '\n')) {
                    pos += 1;
                }
                em.emit(pos);
                continue;
            }
            let mut n_ws = 0;
            let mut last_rn_end = 0;
            while fg(pos + n_ws).is_whitespace() {
                if matches!(cpts[pos + n_ws], '\r' | '\n') {
                    last_rn_end = pos + n_ws + 1;
                }
                n_ws += 1;
            }
            if last_rn_end > 0 {
                pos = last_rn_end;
            } else if n_ws > 1 && pos + n_ws < end {
                pos += n_ws - 1;
            } else if n_ws > 0 {
                pos += n_ws;
            } else {
                pos += 1;
            }
            em.emit(pos);
        }
    }
}

/// AFMoE digits (llama.cpp `unicode_regex_split_custom_afmoe`): a run of number code points is
/// split into a leading group of `len % 3` (if not zero) and groups of 3; the text between runs
/// is kept whole.
fn split_afmoe_digits(fl: &[Flags], offsets: &[usize], out: &mut Vec<usize>) {
    for (ini, end) in segments(offsets) {
        let mut em = Emitter { out, prev: ini };
        let mut pos = ini;
        while pos < end {
            if fl[pos].is_number() {
                let start = pos;
                while pos < end && fl[pos].is_number() {
                    pos += 1;
                }
                let count = pos - start;
                let mut cur = start;
                if count % 3 > 0 {
                    cur += count % 3;
                    em.emit(cur);
                }
                while cur < pos {
                    cur += 3;
                    em.emit(cur);
                }
                continue;
            }
            pos += 1;
        }
        if em.prev < end {
            em.emit(end);
        }
    }
}

/// The view character of one code point.
#[inline]
fn view_char(c: char, f: Flags, collapsed: bool) -> char {
    if (c as u32) < 0x80 {
        return c;
    }
    if f.is_whitespace() {
        return '\u{0B}';
    }
    if !collapsed {
        return c;
    }
    match f.category() {
        Category::Number => COLLAPSED_NUMBER,
        Category::Letter => COLLAPSED_LETTER,
        Category::Punctuation => COLLAPSED_PUNCT,
        Category::Mark => COLLAPSED_MARK,
        Category::Symbol => COLLAPSED_SYMBOL,
        _ => COLLAPSED_OTHER,
    }
}

/// Runs a general expression over every segment of the view (llama.cpp
/// `unicode_regex_split_stl`): matches and the gaps between them become words.
fn split_regex(
    re: &fancy_regex::Regex,
    collapsed: bool,
    cpts: &[char],
    fl: &[Flags],
    offsets: &[usize],
    out: &mut Vec<usize>,
) {
    let mut view = String::new();
    let mut warned = false;
    for (ini, end) in segments(offsets) {
        view.clear();
        for p in ini..end {
            view.push(view_char(cpts[p], fl[p], collapsed));
        }
        // byte offset in `view` -> code point index, walked forward as matches arrive
        let mut cur_byte = 0usize;
        let mut cur_cpt = ini;
        let mut to_cpt = |byte: usize, view: &str| {
            while cur_byte < byte {
                cur_byte += view[cur_byte..].chars().next().map_or(1, char::len_utf8);
                cur_cpt += 1;
            }
            cur_cpt
        };
        let mut last = ini;
        let mut pos = 0usize;
        while pos <= view.len() {
            let m = match re.find_from_pos(&view, pos) {
                Ok(Some(m)) => m,
                Ok(None) => break,
                Err(e) => {
                    if !warned {
                        eprintln!(
                            "{}: warning: pre-tokenizer gave up on a piece ({e}); kept it whole",
                            crate::cli::prog()
                        );
                        warned = true;
                    }
                    break;
                }
            };
            let (ms, me) = (to_cpt(m.start(), &view), to_cpt(m.end(), &view));
            if ms > last {
                out.push(ms - last);
            }
            out.push(me - ms);
            last = me;
            pos = if m.end() > m.start() {
                m.end()
            } else {
                match view[m.end()..].chars().next() {
                    Some(c) => m.end() + c.len_utf8(),
                    None => break,
                }
            };
        }
        if last < end {
            out.push(end - last);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokenizer::pre::{regex_exprs, PreType};

    fn words(s: &Splitter, text: &str) -> Vec<String> {
        s.split(text)
            .into_iter()
            .map(|r| text[r].to_string())
            .collect()
    }

    #[test]
    fn gpt2_splits_like_the_regex() {
        let s = Splitter::new(&[GPT2_RE], true).unwrap();
        assert_eq!(
            words(&s, "Hello world's  best\n\n 123!!"),
            ["Hello", " world", "'s", " ", " best", "\n\n", " 123", "!!"]
        );
    }

    #[test]
    fn llama3_groups_digits_by_three() {
        let s = Splitter::new(&[LLAMA3_RE], true).unwrap();
        assert_eq!(
            words(&s, "x 1234567 I'M\r\n\n  y"),
            ["x", " ", "123", "456", "7", " I", "'M", "\r\n\n", " ", " y"]
        );
    }

    #[test]
    fn every_expression_compiles() {
        use PreType::*;
        for t in [
            Default,
            Llama3,
            Jais2,
            DeepseekLlm,
            Deepseek3Llm,
            Spark2_5,
            Youtu,
            DeepseekCoder,
            Falcon,
            Starcoder,
            Gpt2,
            Qwen2,
            Qwen35,
            Poro,
            Viking,
            Tekken,
            Chameleon,
            Gpt4o,
            GraniteEmbMulti,
            TinyAya,
            KimiK2,
            Superbpe,
            Bailingmoe,
            SeedCoder,
            Ufakzeka,
            Grok2,
            Afmoe,
            Laguna,
            ExaoneMoe,
            Gemma4,
            Minicpm5,
            Whitespace,
        ] {
            let (exprs, _) = regex_exprs(t);
            Splitter::new(&exprs, false).unwrap_or_else(|e| panic!("{t:?}: {e}"));
            let s = Splitter::new(&exprs, true).unwrap();
            let text = "Hello, World! 1234 naïve 'S café\t\n  中文 😀 ~$ IMGIMGABZ <sentinel:3>";
            let ranges = s.split(text);
            let joined: String = ranges.iter().map(|r| &text[r.clone()]).collect();
            assert_eq!(joined, text, "{t:?} must cover the text");
        }
    }

    #[test]
    fn collapsed_symbol_class_misses_tilde() {
        // llama.cpp's collapsed \p{S} covers $+<=>^`| but not ~.
        let s = Splitter::new(&[r"\p{S}+"], false).unwrap();
        assert_eq!(words(&s, "a~$+b"), ["a~", "$+", "b"]);
    }

    #[test]
    fn superbpe_groups_digits_from_the_right() {
        let (exprs, _) = regex_exprs(PreType::Superbpe);
        let s = Splitter::new(&exprs, true).unwrap();
        assert_eq!(words(&s, "1234567x"), ["1", "234", "567", "x"]);
    }

    /// A small deterministic generator of awkward text: letters of several scripts, digits,
    /// marks, punctuation, symbols and every kind of white space.
    fn random_text(seed: &mut u64, len: usize) -> String {
        const POOL: &[&str] = &[
            "a", "B", "z", "é", "Ж", "中", "ß", "1", "7", "٣", "½", "'", "'s", "'T", "'re", "'LL",
            " ", "  ", "\t", "\n", "\r", "\r\n", "\u{A0}", "\u{3000}", "\u{85}", "\u{2028}", ".",
            ",", "!", "?", "~", "$", "+", "<", "_", "-", "\u{301}", "😀", "\u{378}", "\u{0}",
            "\u{AD}", "/", "\u{1F}",
        ];
        let mut s = String::new();
        for _ in 0..len {
            *seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            s.push_str(POOL[((*seed >> 33) as usize) % POOL.len()]);
        }
        s
    }

    fn check_same(exprs: &[&str], reference: Level) {
        let fast = Splitter::new(exprs, true).unwrap();
        let general = Splitter::with_level(exprs, reference).unwrap();
        let mut seed = 12345u64;
        for i in 0..3000 {
            let text = random_text(&mut seed, 1 + i % 40);
            assert_eq!(
                fast.split(&text),
                general.split(&text),
                "{exprs:?} on {text:?}"
            );
        }
    }

    #[test]
    fn qwen2_fast_path_equals_general_engine() {
        check_same(&[QWEN2_RE], Level::General);
    }

    #[test]
    fn each_number_fast_path_equals_general_engine() {
        check_same(&[r"\p{N}", GPT2_RE], Level::LlamaCpp);
    }

    #[test]
    fn llama_cpp_custom_splitters_equal_their_expressions() {
        // llama.cpp's custom splitters stand for these expressions; the ports must agree
        // with the general engine running the expressions themselves.
        check_same(&[GPT2_RE], Level::General);
        check_same(&[LLAMA3_RE], Level::General);
    }
}
