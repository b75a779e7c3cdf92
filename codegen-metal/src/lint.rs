//! A check of a Metal source for what the CPU shim (`codegen_cuda::shim`) compiles but the
//! Metal compiler would refuse, or what is outside the kernel vocabulary of `codegen_cuda`.
//!
//! It reads the source as written (the prelude's macros unexpanded, preprocessor lines
//! skipped), token by token; it is a lint, not a parser: it knows the vocabulary's words
//! (`GMEM`, `FN`, `KERNEL`, `SHARED`) and the C type names, and looks for:
//!
//! - a pointer or reference type without an address space (`GMEM`, `device`, `threadgroup`,
//!   `constant`, `thread`), in a parameter, a variable, a cast or a return type: a `*` or `&`
//!   right after a type name (a multiplication has a value on its left, not a type);
//! - `double`; `std::`; `goto`, `new`, `delete`, `printf`;
//! - names starting with `__` (CUDA builtins such as `__syncthreads`, compiler extensions)
//!   and CUDA's `threadIdx`, `blockIdx`, `blockDim`, `gridDim`, `warpSize`;
//! - recursion: an `FN` that calls itself, directly or through other `FN`s;
//! - shared memory (`SHARED`, a `threadgroup` variable) declared in an `FN`: Metal allows
//!   threadgroup variables at kernel scope only.
//! - a variable at file (program) scope outside the constant address space (`CONSTANT`,
//!   `constant`): Metal keeps program-scope variables, such as the lookup tables of the
//!   dequantizers, in `constant` only.

use std::collections::{BTreeMap, BTreeSet};

/// Words that give a pointer or reference its address space.
const ADDRESS_SPACES: [&str; 5] = ["GMEM", "device", "threadgroup", "constant", "thread"];

/// Type names every source has (C's, Metal's, the vocabulary's integer types).
const TYPES: [&str; 26] = [
    "void", "bool", "char", "short", "int", "long", "float", "half", "unsigned", "signed", "uchar",
    "ushort", "uint", "ulong", "u8", "i8", "u16", "i16", "u32", "i32", "u64", "i64", "uint2",
    "uint3", "float2", "float4",
];

const FORBIDDEN: [(&str, &str); 4] = [
    ("goto", "`goto`"),
    ("new", "`new` (no dynamic allocation in a kernel)"),
    ("delete", "`delete` (no dynamic allocation in a kernel)"),
    ("printf", "`printf`"),
];

const CUDA_NAMES: [&str; 5] = ["threadIdx", "blockIdx", "blockDim", "gridDim", "warpSize"];

#[derive(Debug)]
struct Tok<'a> {
    text: &'a str,
    line: usize,
}

/// The source with comments, string and character literals blanked and preprocessor lines
/// (with their continuations) removed; newlines kept, so that lines still count.
fn blank(source: &str) -> String {
    let b = source.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    let mut line_start = true;
    while i < b.len() {
        let c = b[i];
        if line_start && c == b'#' {
            // A directive: up to an unescaped end of line.
            while i < b.len() && b[i] != b'\n' {
                if b[i] == b'\\' && i + 1 < b.len() && b[i + 1] == b'\n' {
                    out.push(b'\n');
                    i += 2;
                    continue;
                }
                i += 1;
            }
            continue;
        }
        if c == b'/' && b.get(i + 1) == Some(&b'/') {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
            continue;
        }
        if c == b'/' && b.get(i + 1) == Some(&b'*') {
            i += 2;
            while i < b.len() && !(b[i] == b'*' && b.get(i + 1) == Some(&b'/')) {
                out.push(if b[i] == b'\n' { b'\n' } else { b' ' });
                i += 1;
            }
            i += 2;
            out.push(b' ');
            continue;
        }
        if c == b'"' || c == b'\'' {
            i += 1;
            while i < b.len() && b[i] != c && b[i] != b'\n' {
                if b[i] == b'\\' {
                    i += 1;
                }
                i += 1;
            }
            i += 1;
            out.push(b' ');
            continue;
        }
        if c == b'\n' {
            line_start = true;
        } else if !c.is_ascii_whitespace() {
            line_start = false;
        }
        out.push(c);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn tokens(text: &str) -> Vec<Tok<'_>> {
    let b = text.as_bytes();
    let mut toks = Vec::new();
    let mut line = 1;
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        let start = i;
        if c == b'\n' {
            line += 1;
            i += 1;
            continue;
        }
        if c.is_ascii_whitespace() {
            i += 1;
            continue;
        }
        if c.is_ascii_alphabetic() || c == b'_' {
            while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_') {
                i += 1;
            }
        } else if c.is_ascii_digit() {
            while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'.') {
                i += 1;
            }
        } else if (c == b':' || c == b'&') && b.get(i + 1) == Some(&c) {
            // `::` and `&&` (not a reference after a type).
            i += 2;
        } else {
            // One character (UTF-8 continuation bytes with their lead byte).
            i += 1;
            while i < b.len() && (b[i] & 0xc0) == 0x80 {
                i += 1;
            }
        }
        toks.push(Tok {
            text: &text[start..i],
            line,
        });
    }
    toks
}

fn is_ident(t: &str) -> bool {
    t.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
}

/// Index of the token closing the bracket opened at `open`, if any.
fn closing(toks: &[Tok], open: usize) -> Option<usize> {
    let (o, c) = match toks[open].text {
        "(" => ("(", ")"),
        "{" => ("{", "}"),
        _ => return None,
    };
    let mut depth = 0usize;
    for (j, t) in toks.iter().enumerate().skip(open) {
        if t.text == o {
            depth += 1;
        } else if t.text == c {
            depth -= 1;
            if depth == 0 {
                return Some(j);
            }
        }
    }
    None
}

/// An `FN` definition: its name and the token range of its body.
struct Func {
    name: String,
    line: usize,
    body: std::ops::Range<usize>,
}

fn functions(toks: &[Tok]) -> Vec<Func> {
    let mut out = Vec::new();
    for (i, t) in toks.iter().enumerate() {
        if t.text != "FN" {
            continue;
        }
        let Some(open) = (i + 1..toks.len()).find(|&j| matches!(toks[j].text, "(" | ";" | "{"))
        else {
            continue;
        };
        if toks[open].text != "(" || open == 0 || !is_ident(toks[open - 1].text) {
            continue;
        }
        let Some(close) = closing(toks, open) else {
            continue;
        };
        if toks.get(close + 1).map(|t| t.text) != Some("{") {
            continue; // a declaration
        }
        let Some(end) = closing(toks, close + 1) else {
            continue;
        };
        out.push(Func {
            name: toks[open - 1].text.to_string(),
            line: toks[open - 1].line,
            body: close + 2..end,
        });
    }
    out
}

/// Problems of `source` (a complete Metal source: `METAL_PRELUDE` and kernels) that the
/// shim would not notice but Metal would refuse, one `line N: what` string each, in source
/// order (recursion last). Empty when the lint finds nothing.
pub fn lint(source: &str) -> Vec<String> {
    let text = blank(source);
    let toks = tokens(&text);
    let mut found: Vec<(usize, String)> = Vec::new();

    // Type names: the built-in ones, typedefs, aliases and structs of the source.
    let mut types: BTreeSet<&str> = TYPES.into_iter().collect();
    for (i, t) in toks.iter().enumerate() {
        if t.text == "typedef" {
            if let Some(end) = (i..toks.len()).find(|&j| toks[j].text == ";") {
                if is_ident(toks[end - 1].text) {
                    types.insert(toks[end - 1].text);
                }
            }
        } else if t.text == "using" && toks.get(i + 2).map(|t| t.text) == Some("=") {
            types.insert(toks[i + 1].text);
        } else if t.text == "struct" {
            if let Some(n) = toks.get(i + 1).filter(|n| is_ident(n.text)) {
                types.insert(n.text);
            }
        }
    }

    for (i, t) in toks.iter().enumerate() {
        let w = t.text;
        let next = toks.get(i + 1).map(|t| t.text);
        if w == "double" {
            found.push((t.line, "`double`: Metal has no double precision".into()));
        } else if w == "std" && next == Some("::") {
            found.push((t.line, "`std::`: no C++ standard library in Metal".into()));
        } else if w.starts_with("__") {
            found.push((
                t.line,
                format!("`{w}`: a CUDA builtin or compiler extension, not Metal"),
            ));
        } else if CUDA_NAMES.contains(&w) {
            found.push((t.line, format!("`{w}`: a CUDA builtin, not Metal")));
        } else if let Some((_, what)) = FORBIDDEN.iter().find(|(k, _)| *k == w) {
            found.push((t.line, format!("{what}: not allowed in a Metal kernel")));
        } else if w == "*" || w == "&" {
            // Back over qualifiers and further `*` to what the declarator applies to.
            let mut j = i;
            while j > 0 && matches!(toks[j - 1].text, "const" | "volatile" | "*") {
                j -= 1;
            }
            if j == 0 || !types.contains(toks[j - 1].text) {
                continue; // an operator
            }
            if w == "*" && toks[i - 1].text == "*" {
                continue; // reported at the first `*`
            }
            // The declaration's specifiers: back to a delimiter.
            let from = (0..j)
                .rev()
                .find(|&k| matches!(toks[k].text, "(" | "," | ";" | "{" | "}" | ")" | "<"))
                .map_or(0, |k| k + 1);
            if !toks[from..j]
                .iter()
                .any(|t| ADDRESS_SPACES.contains(&t.text))
            {
                let ty: Vec<&str> = toks[from..=i].iter().map(|t| t.text).collect();
                found.push((
                    t.line,
                    format!(
                        "`{}` without an address space (GMEM, device, threadgroup, constant or \
                         thread): Metal requires one",
                        ty.join(" ")
                    ),
                ));
            }
        }
    }

    found.extend(program_scope_variables(&toks));

    // FN bodies: shared memory, and the call graph for recursion.
    let funcs = functions(&toks);
    let names: BTreeSet<&str> = funcs.iter().map(|f| f.name.as_str()).collect();
    let mut calls: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for f in &funcs {
        let body = &toks[f.body.clone()];
        for (k, t) in body.iter().enumerate() {
            if t.text == "SHARED" || t.text == "threadgroup" {
                let decl_end = body[k..]
                    .iter()
                    .position(|t| matches!(t.text, ";" | "=" | ")" | ","))
                    .unwrap_or(body.len() - k);
                if !body[k..k + decl_end].iter().any(|t| t.text == "*") {
                    found.push((
                        t.line,
                        format!(
                            "shared memory declared in FN {}: Metal allows threadgroup \
                             variables in a kernel only",
                            f.name
                        ),
                    ));
                }
            }
            if names.contains(t.text) && body.get(k + 1).map(|t| t.text) == Some("(") {
                calls.entry(f.name.as_str()).or_default().insert(t.text);
            }
        }
    }
    found.sort_by_key(|(line, _)| *line);
    let mut out: Vec<String> = found
        .into_iter()
        .map(|(line, msg)| format!("line {line}: {msg}"))
        .collect();
    for f in &funcs {
        if let Some(path) = cycle_from(&f.name, &calls) {
            out.push(format!(
                "line {}: FN {} is recursive ({}): Metal has no recursion",
                f.line,
                f.name,
                path.join(" -> ")
            ));
        }
    }
    out
}

/// The file-scope variables declared without `CONSTANT` / `constant`, as `(line, what)`.
/// A top-level statement is a variable declaration when a `[` or `=` comes before any `(`
/// (function and kernel definitions have their parameter list first); bodies of functions
/// and structs are skipped whole.
fn program_scope_variables(toks: &[Tok]) -> Vec<(usize, String)> {
    let mut found = Vec::new();
    let mut i = 0;
    while i < toks.len() {
        let start = i;
        let mut declarator = None;
        let mut seen_paren = false;
        while i < toks.len() {
            match toks[i].text {
                "(" => {
                    seen_paren = true;
                    i = closing(toks, i).map_or(toks.len(), |c| c + 1);
                    continue;
                }
                "{" => {
                    let close = closing(toks, i).map_or(toks.len(), |c| c + 1);
                    if i > start && matches!(toks[i - 1].text, "=" | "]") {
                        i = close; // an initializer
                        continue;
                    }
                    // A function's or a struct's body ends the statement (with its `;`).
                    i = close;
                    if toks.get(i).map(|t| t.text) == Some(";") {
                        i += 1;
                    }
                    break;
                }
                "[" | "=" if !seen_paren && declarator.is_none() => declarator = Some(i),
                ";" => {
                    i += 1;
                    break;
                }
                _ => {}
            }
            i += 1;
        }
        let Some(d) = declarator else { continue };
        let head = &toks[start..d];
        if matches!(head.first().map(|t| t.text), Some("typedef" | "using"))
            || head
                .iter()
                .any(|t| matches!(t.text, "CONSTANT" | "constant"))
        {
            continue;
        }
        let name = head.last().map_or("?", |t| t.text);
        found.push((
            toks[start].line,
            format!(
                "`{name}`: a program-scope variable outside the constant address space \
                 (CONSTANT): Metal requires `constant`"
            ),
        ));
    }
    found
}

/// A call path from `start` back to itself, if there is one.
fn cycle_from<'a>(
    start: &'a str,
    calls: &BTreeMap<&'a str, BTreeSet<&'a str>>,
) -> Option<Vec<&'a str>> {
    let mut stack: Vec<(&str, Vec<&str>)> = vec![(start, vec![start])];
    let mut seen: BTreeSet<&str> = BTreeSet::new();
    while let Some((f, path)) = stack.pop() {
        for &g in calls.get(f).into_iter().flatten() {
            if g == start {
                let mut p = path.clone();
                p.push(g);
                return Some(p);
            }
            if seen.insert(g) {
                let mut p = path.clone();
                p.push(g);
                stack.push((g, p));
            }
        }
    }
    None
}
