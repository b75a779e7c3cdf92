//! The CPU backend's pass filetests: every `.ir` file under `tests/filetests/` whose header
//! says `; target: cpu` and `; pass: select-kernels` is one case, a plan as text, the CPU
//! (`; cpu: NAME`, as `--cpu` takes it; `native` by default) and the summation order
//! (`; kernels: exact|fast`, default exact) to choose for, and the plan expected after the
//! pass (or `error: …`). The other cases are `compiler/tests/filetests.rs`'s.
//! `MODELC_BLESS=1` rewrites the expected part of every failing case.

use codegen_cpu::select::{select_kernels, PASS_NAME};
use codegen_cpu::target::CpuTarget;
use codegen_cpu::SumOrder;
use modelc_tests::filetest::{self, Outcome};

/// What the header of a CPU case says (`None`: not a CPU case).
struct Header {
    pass: String,
    cpu: String,
    order: SumOrder,
}

fn header(input: &str) -> Result<Option<Header>, String> {
    let (mut target, mut pass, mut cpu, mut order) = (None, None, None, SumOrder::Ggml);
    for line in input.lines().map(str::trim).filter(|l| !l.is_empty()) {
        let Some(c) = line.strip_prefix(';') else {
            break;
        };
        let Some((key, value)) = c.split_once(':') else {
            continue;
        };
        let value = value.trim().to_string();
        match key.trim() {
            "target" => target = Some(value),
            "pass" => pass = Some(value),
            "cpu" => cpu = Some(value),
            "kernels" => {
                order = match value.as_str() {
                    "exact" => SumOrder::Ggml,
                    "fast" => SumOrder::Block,
                    v => return Err(format!("`kernels` is exact or fast, found `{v}`")),
                }
            }
            _ => {}
        }
    }
    if target.as_deref() != Some("cpu") {
        return Ok(None);
    }
    let pass = pass.ok_or("a CPU case names no pass (`; pass: select-kernels`)")?;
    if pass != PASS_NAME {
        return Err(format!(
            "the CPU backend has no pass `{pass}` ({PASS_NAME})"
        ));
    }
    Ok(Some(Header {
        pass,
        cpu: cpu.unwrap_or_else(|| "native".into()),
        order,
    }))
}

/// The plan printed after the pass, or `error: …`.
fn run_case(input: &str, h: &Header) -> Result<String, String> {
    let mut plan = ir::plan::parse_plan(input).map_err(|e| format!("input, {e}"))?;
    plan.verify()
        .map_err(|e| format!("the input plan does not verify: {e}"))?;
    let cpu = CpuTarget::named(&h.cpu)?;
    Ok(match select_kernels(&mut plan, &cpu, h.order) {
        Ok(()) => {
            let text = plan.to_string();
            let back = ir::plan::parse_plan(&text)
                .map_err(|e| format!("the output does not parse: {e}\n{text}"))?;
            if back != plan {
                return Err(format!(
                    "the output does not read back as the same plan:\n{text}"
                ));
            }
            text
        }
        Err(e) => format!("error: {e}\n"),
    })
}

#[test]
fn select_kernels_filetests() {
    let dir = filetest::dir();
    let bless = filetest::bless();
    let (mut ran, mut failed) = (0, Vec::new());
    for f in filetest::ir_files(&dir) {
        let short = f.strip_prefix(&dir).unwrap_or(&f).display().to_string();
        let outcome = filetest::check(&f, bless, |input| {
            let Some(h) = header(input)? else {
                return Ok(None);
            };
            Ok(Some((h.pass.clone(), run_case(input, &h)?)))
        });
        match outcome {
            Ok(Outcome::Skipped) => {}
            Ok(_) => ran += 1,
            Err(msg) => failed.push(format!("tests/filetests/{short}: {msg}")),
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n\n"));
    assert!(ran > 0, "no `; target: cpu` case for {PASS_NAME}");
}
