//! The filetest harness the pass runners share (`compiler/tests/filetests.rs` for the
//! target-independent passes, `codegen-cpu/tests/filetests.rs` for the CPU backend's):
//! finding the cases under `tests/filetests/`, splitting a case into its input and expected
//! part, comparing, blessing (`MODELC_BLESS=1`) and the line diff of a failure.
//! `tests/filetests/README.md` describes the format.

use std::path::{Path, PathBuf};

/// The line between a case's input and its expected output.
pub const SEPARATOR: &str = "; ---- expected ----";

/// `tests/filetests/` at the workspace root.
pub fn dir() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/filetests"))
}

/// Every `.ir` file under `dir`, sorted.
pub fn ir_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    collect(dir, &mut out);
    out.sort();
    out
}

fn collect(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            collect(&p, out);
        } else if p.extension().is_some_and(|x| x == "ir") {
            out.push(p);
        }
    }
}

/// What became of one case.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The pass gave the expected module.
    Passed,
    /// The expected part was rewritten (`MODELC_BLESS=1`).
    Blessed,
    /// The case is another runner's.
    Skipped,
}

/// Whether `MODELC_BLESS=1` asks to accept what the passes give now.
pub fn bless() -> bool {
    std::env::var("MODELC_BLESS").as_deref() == Ok("1")
}

/// Checks the case in `path`: `run(input)` gives what the pass `pass` prints now (`None`:
/// the case is not this runner's), compared with the expected part, or written there with
/// `bless`.
///
/// # Errors
/// An unreadable file, what `run` reports, or the difference (a line diff).
pub fn check(
    path: &Path,
    bless: bool,
    run: impl FnOnce(&str) -> Result<Option<(String, String)>, String>,
) -> Result<Outcome, String> {
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
    let Some((pass, got)) = run(input)? else {
        return Ok(Outcome::Skipped);
    };
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

/// A line diff of `want` and `got` (`-` expected, `+` got), with two lines of context.
pub fn diff(want: &str, got: &str) -> String {
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
