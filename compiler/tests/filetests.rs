//! The pass filetests: every `.ir` file under `tests/filetests/` (at the workspace root)
//! whose header names a pass is one case: a module as text, the pass to run on it, and the
//! module expected after it (or the error expected). `tests/filetests/README.md` describes
//! the format. With `MODELC_BLESS=1` the expected part of every failing case is rewritten
//! with what the pass gives now.

use compiler::passes::{pass_names, run_pass, CompileOptions, FixedGraphs, Module, PassCtx};
use ir::graph::{DType, KvTypes};
use std::path::{Path, PathBuf};

/// The line between a case's input and its expected output.
const SEPARATOR: &str = "; ---- expected ----";

fn filetests_dir() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/filetests"))
}

/// Every `.ir` file under `dir`, sorted.
fn ir_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            ir_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "ir") {
            out.push(p);
        }
    }
    out.sort();
}

/// What a case's header says.
#[derive(Default)]
struct Header {
    pass: Option<String>,
    /// A backend case (`; target: cuda`), for the backends' runners.
    target: Option<String>,
    opts: CompileOptions,
}

fn kv_type(v: &str) -> Result<DType, String> {
    match v {
        "f32" => Ok(DType::F32),
        "f16" => Ok(DType::F16),
        "q8_0" => Ok(DType::Block(ir::ggml::GgmlType::Q8_0)),
        _ => Err(format!("KV cache type `{v}` (f32, f16 or q8_0)")),
    }
}

/// Reads the directives of the leading comment lines: `; key: value` with a lower-case key.
fn header(input: &str) -> Result<Header, String> {
    let mut h = Header {
        opts: CompileOptions {
            kv_types: KvTypes::F16,
            ..CompileOptions::default()
        },
        ..Header::default()
    };
    for (i, line) in input.lines().enumerate() {
        let t = line.trim();
        if t.is_empty() {
            continue;
        }
        let Some(c) = t.strip_prefix(';') else { break };
        let Some((key, value)) = c.split_once(':') else {
            continue;
        };
        let key = key.trim();
        if key.is_empty() || !key.chars().all(|ch| ch.is_ascii_lowercase() || ch == '_') {
            continue;
        }
        let value = value.trim();
        let bad = |what: String| format!("line {}: {what}", i + 1);
        let num = |v: &str| {
            v.parse::<u32>()
                .map_err(|_| bad(format!("`{key}` needs a number, found `{v}`")))
        };
        match key {
            "pass" => {
                if !pass_names().contains(&value) {
                    return Err(bad(format!(
                        "no pass named `{value}` (passes: {})",
                        pass_names().join(", ")
                    )));
                }
                h.pass = Some(value.to_string());
            }
            "target" => h.target = Some(value.to_string()),
            "n_ctx" => h.opts.n_ctx = num(value)?,
            "align" => h.opts.align = num(value)? as u64,
            "ubatch" => {
                h.opts.ubatches = value
                    .split(',')
                    .map(|v| num(v.trim()))
                    .collect::<Result<_, _>>()?
            }
            "all_logits" => {
                h.opts.all_logits = match value {
                    "true" => true,
                    "false" => false,
                    _ => return Err(bad(format!("`all_logits` is true or false, found `{value}`"))),
                }
            }
            "ctk" => h.opts.kv_types.k = kv_type(value).map_err(bad)?,
            "ctv" => h.opts.kv_types.v = kv_type(value).map_err(bad)?,
            _ => {
                return Err(bad(format!(
                    "unknown directive `{key}` (pass, n_ctx, ubatch, all_logits, ctk, ctv, align, target)"
                )))
            }
        }
    }
    Ok(h)
}

/// What a case gives now: the module printed after the pass, or `error: …`.
fn run_case(input: &str, h: &Header, pass: &str) -> Result<String, String> {
    let mut m = Module::parse(input).map_err(|e| format!("input, {e}"))?;
    for (s, g) in &m.graphs {
        g.verify()
            .map_err(|e| format!("input graph n_tokens={}: {e}", s.n_tokens))?;
    }
    if let Some(p) = &m.plan {
        p.verify()
            .map_err(|e| format!("the input plan does not verify: {e}"))?;
    }
    let source = FixedGraphs(m.graphs.clone());
    let cx = PassCtx {
        source: &source,
        opts: &h.opts,
    };
    Ok(match run_pass(pass, &mut m, &cx) {
        Ok(()) => {
            let text = m.to_string();
            // What a pass prints reads back as the same module.
            let back = Module::parse(&text)
                .map_err(|e| format!("the output does not parse: {e}\n{text}"))?;
            if back.to_string() != text {
                return Err(format!(
                    "the output does not print the same once parsed:\n{text}"
                ));
            }
            text
        }
        Err(e) => format!("error: {e}\n"),
    })
}

/// A line diff of `want` and `got` (`-` expected, `+` got), with two lines of context.
fn diff(want: &str, got: &str) -> String {
    let (a, b): (Vec<&str>, Vec<&str>) = (want.lines().collect(), got.lines().collect());
    let (n, m) = (a.len(), b.len());
    if n * m > 4_000_000 {
        let i = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
        return format!(
            "first difference at line {}:\n- {}\n+ {}\n",
            i + 1,
            a.get(i).unwrap_or(&"<end>"),
            b.get(i).unwrap_or(&"<end>")
        );
    }
    // Longest common subsequence table, from the back.
    let mut l = vec![vec![0u32; m + 1]; n + 1];
    for i in (0..n).rev() {
        for j in (0..m).rev() {
            l[i][j] = if a[i] == b[j] {
                l[i + 1][j + 1] + 1
            } else {
                l[i + 1][j].max(l[i][j + 1])
            };
        }
    }
    let mut ops: Vec<(char, &str)> = Vec::new();
    let (mut i, mut j) = (0, 0);
    while i < n || j < m {
        if i < n && j < m && a[i] == b[j] {
            ops.push((' ', a[i]));
            i += 1;
            j += 1;
        } else if i < n && (j == m || l[i + 1][j] >= l[i][j + 1]) {
            ops.push(('-', a[i]));
            i += 1;
        } else {
            ops.push(('+', b[j]));
            j += 1;
        }
    }
    let near = |k: usize| {
        let lo = k.saturating_sub(2);
        let hi = (k + 3).min(ops.len());
        ops[lo..hi].iter().any(|o| o.0 != ' ')
    };
    let mut out = String::new();
    let mut skipped = false;
    for (k, (c, line)) in ops.iter().enumerate() {
        if near(k) {
            if skipped {
                out += "  …\n";
                skipped = false;
            }
            out += &format!("{c} {line}\n");
        } else {
            skipped = true;
        }
    }
    out
}

enum Outcome {
    Passed,
    Blessed,
    Skipped,
}

fn run_file(path: &Path, bless: bool) -> Result<Outcome, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read: {e}"))?;
    let (input, expected) = match text.find(&format!("\n{SEPARATOR}")) {
        Some(at) => {
            let rest = &text[at + 1 + SEPARATOR.len()..];
            let rest = rest.strip_prefix('\n').unwrap_or(rest);
            (&text[..at + 1], Some(rest))
        }
        None if text.starts_with(SEPARATOR) => ("", Some(&text[SEPARATOR.len()..])),
        None => (text.as_str(), None),
    };
    let h = header(input)?;
    let Some(pass) = h.pass.clone() else {
        if h.target.is_some() {
            return Ok(Outcome::Skipped);
        }
        return Err("the header names no pass (`; pass: NAME`)".to_string());
    };
    let got = run_case(input, &h, &pass)?;
    if expected == Some(got.as_str()) {
        return Ok(Outcome::Passed);
    }
    if bless {
        let mut new = input.to_string();
        if !new.is_empty() && !new.ends_with('\n') {
            new.push('\n');
        }
        new += SEPARATOR;
        new.push('\n');
        new += &got;
        std::fs::write(path, new).map_err(|e| format!("cannot bless: {e}"))?;
        return Ok(Outcome::Blessed);
    }
    Err(match expected {
        None => format!("no `{SEPARATOR}` line; run with MODELC_BLESS=1 to write what `{pass}` gives:\n{got}"),
        Some(want) => format!(
            "after `{pass}` the module differs from the expected one (- expected, + got; MODELC_BLESS=1 accepts it):\n{}",
            diff(want, &got)
        ),
    })
}

#[test]
fn filetests() {
    let dir = filetests_dir();
    let mut files = Vec::new();
    ir_files(&dir, &mut files);
    assert!(!files.is_empty(), "no .ir files under {}", dir.display());
    let bless = std::env::var("MODELC_BLESS").as_deref() == Ok("1");
    let mut failed = Vec::new();
    let mut covered = std::collections::BTreeSet::new();
    let (mut passed, mut blessed, mut skipped) = (0, 0, 0);
    for f in &files {
        let short = f.strip_prefix(&dir).unwrap_or(f).display().to_string();
        match run_file(f, bless) {
            Ok(o) => {
                match o {
                    Outcome::Passed => passed += 1,
                    Outcome::Blessed => {
                        blessed += 1;
                        eprintln!("blessed {short}");
                    }
                    Outcome::Skipped => skipped += 1,
                }
                if let Ok(text) = std::fs::read_to_string(f) {
                    if let Ok(Header { pass: Some(p), .. }) = header(&text) {
                        covered.insert(p);
                    }
                }
            }
            Err(msg) => failed.push(format!("tests/filetests/{short}: {msg}")),
        }
    }
    eprintln!(
        "filetests: {passed} passed, {blessed} blessed, {skipped} left to the backends, {} failed",
        failed.len()
    );
    assert!(failed.is_empty(), "{}", failed.join("\n\n"));
    let missing: Vec<&str> = pass_names()
        .into_iter()
        .filter(|p| !covered.contains(*p))
        .collect();
    assert!(missing.is_empty(), "passes without a filetest: {missing:?}");
}
