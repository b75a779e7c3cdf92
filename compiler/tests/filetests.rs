//! The pass filetests: every `.ir` file under `tests/filetests/` (at the workspace root)
//! whose header names a pass is one case: a module as text, the pass to run on it, and the
//! module expected after it (or the error expected). `tests/filetests/README.md` describes
//! the format. With `MODELC_BLESS=1` the expected part of every failing case is rewritten
//! with what the pass gives now.

use compiler::passes::{pass_names, run_pass, CompileOptions, FixedGraphs, Module, PassCtx};
use ir::graph::{DType, KvTypes};
use modelc_tests::filetest::{self, Outcome};
use std::path::Path;

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
            "pass" => h.pass = Some(value.to_string()),
            "target" => h.target = Some(value.to_string()),
            // The CPU backend's directives (`codegen-cpu/tests/filetests.rs`).
            "cpu" | "kernels" => {}
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
                    "unknown directive `{key}` (pass, n_ctx, ubatch, all_logits, ctk, ctv, align, target, cpu, kernels)"
                )))
            }
        }
    }
    if let Some(p) = &h.pass {
        if h.target.is_none() && !pass_names().contains(&p.as_str()) {
            return Err(format!(
                "no pass named `{p}` (passes: {})",
                pass_names().join(", ")
            ));
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

fn run_file(path: &Path, bless: bool) -> Result<Outcome, String> {
    filetest::check(path, bless, |input| {
        let h = header(input)?;
        let Some(pass) = h.pass.clone() else {
            if h.target.is_some() {
                return Ok(None);
            }
            return Err("the header names no pass (`; pass: NAME`)".to_string());
        };
        // A backend's own pass (`; target: cpu`, `; pass: select-kernels`): its runner's.
        if h.target.is_some() && !pass_names().contains(&pass.as_str()) {
            return Ok(None);
        }
        Ok(Some((pass.clone(), run_case(input, &h, &pass)?)))
    })
}

#[test]
fn filetests() {
    let dir = filetest::dir();
    let files = filetest::ir_files(&dir);
    assert!(!files.is_empty(), "no .ir files under {}", dir.display());
    let bless = filetest::bless();
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
