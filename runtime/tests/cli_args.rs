//! Generation flags as a llama.cpp user types them (`common/arg.cpp` semantics), in `modelc
//! run` and in a compiled runner: `-s -1` is a random seed, `-t 0` the hardware's threads and
//! `-t` above them capped with one warning, `-b 0` / `bench -r 0` refused, errors name the
//! multi-letter flag the user typed (`-ngl`), `-c` past the training context warns and past
//! the machine's memory is refused. Errors are one line on stderr and status 1.
//!
//! The tests that run a model need SmolLM2-135M-Instruct Q4_1 (`modelc_tests::smollm2`).

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

mod common;

use common::{json_output, model, modelc};

/// A runner for SmolLM2 compiled once for all tests, with a 256-token context. Every test
/// that finds the model absent records its own skip.
fn runner() -> Option<&'static Path> {
    static RUNNER: OnceLock<Option<PathBuf>> = OnceLock::new();
    let model = model()?;
    RUNNER
        .get_or_init(|| Some(common::compile_runner(&model, "cli_args", 256)))
        .as_deref()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Asserts status 1 with exactly one stderr line containing `what`, and no panic.
fn assert_one_line_error(out: &Output, what: &str) {
    let err = stderr(out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    // `modelc`'s own messages, or the runner's (named `smol` here).
    assert!(
        err.starts_with("modelc: error: ") || err.starts_with("smol: error: "),
        "{err}"
    );
    assert!(err.contains(what), "expected '{what}' in: {err}");
    assert!(!err.contains("panicked"), "{err}");
}

fn assert_ok(out: &Output) {
    assert!(out.status.success(), "failed: {}", stderr(out));
}

fn warnings(out: &Output) -> Vec<String> {
    stderr(out)
        .lines()
        .filter(|l| l.starts_with("modelc: warning:") || l.starts_with("smol: warning:"))
        .map(|l| l.replacen("smol: ", "modelc: ", 1))
        .collect()
}

fn hardware_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// `modelc run` of a missing model with `args` fails in one line containing `want`: the flags
/// are refused before the model is opened.
fn refused_up_front(args: &[&str], want: &str) {
    let out = modelc()
        .args(["run", "/nonexistent/model.gguf", "-p", "x"])
        .args(args)
        .output()
        .unwrap();
    assert_one_line_error(&out, want);
}

/// Flag checks that need no model: they are refused before the model is opened.
#[test]
fn bad_flags_are_one_line_errors_without_a_model() {
    let missing = "/nonexistent/model.gguf";
    let out = modelc()
        .args(["run", missing, "-p", "x", "-b", "0"])
        .output()
        .unwrap();
    assert_one_line_error(&out, "-b must be at least 1");
    let out = modelc()
        .args(["perplexity", missing, "-f", "x.txt", "-b", "0"])
        .output()
        .unwrap();
    assert_one_line_error(&out, "-b must be at least 1");
    for seed in ["-2", "abc", "1.5"] {
        let out = modelc()
            .args(["run", missing, "-p", "x", "-s", seed])
            .output()
            .unwrap();
        assert_one_line_error(&out, "a seed is -1 (random) or a number from 0 up");
    }
    // Sampler values that are not finite numbers, and -n below -2, are refused up front.
    for (args, want) in [
        (["--temp", "nan"], "--temp NaN: expected a finite number"),
        (["--top-p", "inf"], "--top-p inf: expected a finite number"),
        (["-n", "-3"], "-n -3: a number of tokens, -1"),
    ] {
        refused_up_front(&args, want);
    }
    // The multi-letter flags are named as typed, not as the long forms they are rewritten to.
    // (`-np` is the server's: `run` does not take it.)
    let out = modelc()
        .args(["run", missing, "-p", "x", "-np", "5"])
        .output()
        .unwrap();
    assert_one_line_error(&out, "'-np'");
    assert!(!stderr(&out).contains("--parallel"), "{}", stderr(&out));
    let out = modelc()
        .args(["run", missing, "-p", "x", "-ngl", "many"])
        .output()
        .unwrap();
    assert_one_line_error(&out, "'-ngl <N>'");
    assert!(!stderr(&out).contains("--n-gpu-layers"), "{}", stderr(&out));
    let out = modelc()
        .args(["run", missing, "-p", "x", "-fa", "maybe"])
        .output()
        .unwrap();
    assert_one_line_error(&out, "'-fa ");
    assert!(!stderr(&out).contains("--flash-attn"), "{}", stderr(&out));
    // Whether or not -ctk is accepted, an error about it does not name --cache-type-k.
    let out = modelc()
        .args(["run", missing, "-p", "x", "-ctk", "q4_0"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(!stderr(&out).contains("--cache-type-k"), "{}", stderr(&out));
    // Typed in full, the long name stays.
    let out = modelc()
        .args(["run", missing, "-p", "x", "--parallel", "5"])
        .output()
        .unwrap();
    assert_one_line_error(&out, "'--parallel'");
    // A missing argument is named on the one line (clap lists it on the next ones).
    let out = modelc().args(["run"]).output().unwrap();
    assert_one_line_error(&out, "not provided <MODEL>");
    for args in [&["quantize"][..], &["quantize", "in.gguf"]] {
        let out = modelc().args(args).output().unwrap();
        assert_one_line_error(&out, "INPUT.gguf [OUTPUT.gguf] TYPE [NTHREADS]");
    }
}

fn seed_of(v: &Value) -> u64 {
    v["generation_settings"]["seed"]
        .as_u64()
        .unwrap_or_else(|| panic!("no generation_settings.seed in {v}"))
}

/// `-s -1` (and 4294967295, llama.cpp's LLAMA_DEFAULT_SEED) draws a random seed, reported in
/// the JSON; passing that seed back repeats the run.
#[test]
fn seed_minus_one_is_random_and_reported() {
    let Some(runner) = runner() else { return };
    let sample = [
        "-p",
        "Once upon a time",
        "-n",
        "6",
        "--temp",
        "1.5",
        "--top-k",
        "0",
    ];
    let gen = |seed: &str| {
        json_output(
            Command::new(runner)
                .args(sample)
                .args(["-t", "1", "--json", "-s", seed]),
        )
    };
    let a = gen("-1");
    let b = gen("4294967295");
    let (sa, sb) = (seed_of(&a), seed_of(&b));
    assert!(sa < 0xFFFF_FFFF && sb < 0xFFFF_FFFF, "{sa} {sb}");
    assert_ne!(sa, sb, "two random seeds were equal");
    let again = gen(&sa.to_string());
    assert_eq!(seed_of(&again), sa);
    assert_eq!(
        again["content"], a["content"],
        "the reported seed does not repeat the run"
    );
    assert_eq!(seed_of(&gen("7")), 7);
    // Plain mode prints nothing extra; modelc run takes -1 too.
    let out = Command::new(runner)
        .args(sample)
        .args(["-t", "1", "-s", "-1"])
        .output()
        .unwrap();
    assert_ok(&out);
    assert!(stderr(&out).is_empty(), "{}", stderr(&out));
    let model = model().unwrap();
    let v = json_output(
        modelc()
            .arg("run")
            .arg(&model)
            .args(sample)
            .args(["-t", "1", "-c", "64", "--json", "-s", "-1"]),
    );
    assert!(seed_of(&v) < 0xFFFF_FFFF);
}

/// `-t 0` (or negative) is the hardware's threads; more than those is capped there with one
/// warning line, in generation, perplexity and bench; `-b 0` and `-r 0` are refused.
#[test]
fn thread_counts_batch_and_repetitions() {
    let Some(runner) = runner() else { return };
    let hw = hardware_threads();
    let gen = ["-p", "hi", "-n", "2", "--temp", "0"];
    for t in ["0", "-1"] {
        let out = Command::new(runner)
            .args(gen)
            .args(["-t", t])
            .output()
            .unwrap();
        assert_ok(&out);
        assert!(warnings(&out).is_empty(), "{}", stderr(&out));
    }
    let out = Command::new(runner)
        .args(gen)
        .args(["-t", "100000"])
        .output()
        .unwrap();
    assert_ok(&out);
    let w = warnings(&out);
    assert_eq!(w.len(), 1, "{}", stderr(&out));
    assert!(w[0].contains(&format!("using {hw}")), "{}", w[0]);

    let model = model().unwrap();
    let out = modelc()
        .arg("run")
        .arg(&model)
        .args(gen)
        .args(["-c", "64", "-t", "100000"])
        .output()
        .unwrap();
    assert_ok(&out);
    assert_eq!(warnings(&out).len(), 1, "{}", stderr(&out));

    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("cli_args");
    let text = dir.join("ppl.txt");
    std::fs::write(
        &text,
        "The quick brown fox jumps over the lazy dog. ".repeat(30),
    )
    .unwrap();
    let out = Command::new(runner)
        .args(["perplexity", "-c", "64", "-t", "100000", "-f"])
        .arg(&text)
        .output()
        .unwrap();
    assert_ok(&out);
    assert_eq!(warnings(&out).len(), 1, "{}", stderr(&out));
    let out = Command::new(runner)
        .args(["perplexity", "-c", "64", "-b", "0", "-f"])
        .arg(&text)
        .output()
        .unwrap();
    assert_one_line_error(&out, "-b must be at least 1");
    let out = Command::new(runner)
        .args(gen)
        .args(["-b", "0"])
        .output()
        .unwrap();
    assert_one_line_error(&out, "-b must be at least 1");

    let out = Command::new(runner)
        .args(["bench", "-p", "4", "-n", "0", "-r", "0"])
        .output()
        .unwrap();
    assert_one_line_error(&out, "-r must be at least 1");
    // 0 and 100000 both become the hardware's threads (one warning), measured once.
    let out = Command::new(runner)
        .args(["bench", "-p", "4", "-n", "0", "-r", "1", "-t", "0,100000"])
        .output()
        .unwrap();
    assert_ok(&out);
    assert_eq!(warnings(&out).len(), 1, "{}", stderr(&out));
    let table = String::from_utf8_lossy(&out.stdout);
    // llama-bench's table: the lines before the roofline table's blank line.
    let rows: Vec<&str> = table
        .lines()
        .take_while(|l| !l.is_empty())
        .filter(|l| l.contains("pp4"))
        .collect();
    assert!(!rows.is_empty(), "{table}");
    for r in &rows {
        let cells: Vec<&str> = r.split('|').map(str::trim).collect();
        assert!(cells.contains(&hw.to_string().as_str()), "{r}");
    }
    assert_eq!(rows.len(), 1, "{table}");
}

/// In a runner, the multi-letter flags it does not know are named as typed.
#[test]
fn runner_errors_name_the_typed_flag() {
    let Some(runner) = runner() else { return };
    let out = Command::new(runner)
        .args(["-p", "hi", "-np", "5"])
        .output()
        .unwrap();
    assert_one_line_error(&out, "'-np'");
    assert!(!stderr(&out).contains("--parallel"), "{}", stderr(&out));
    let out = Command::new(runner)
        .args(["-p", "hi", "-ctk", "q4_0"])
        .output()
        .unwrap();
    if !out.status.success() {
        assert!(!stderr(&out).contains("--cache-type-k"), "{}", stderr(&out));
    }
}

/// A runner's `-c` runs any context up to the compiled one without re-planning, and refuses
/// a larger one in one line naming the command that compiles it; above the model's training
/// context (8192 for SmolLM2) `modelc run` warns with one line; a KV cache larger than the
/// machine's memory is refused with one line instead of an allocation failure.
#[test]
fn context_beyond_compiled_and_training_sizes() {
    let Some(runner) = runner() else { return };
    let gen = ["-p", "hi", "-n", "2", "--temp", "0", "-t", "1"];
    let out = Command::new(runner)
        .args(gen)
        .args(["-c", "100"])
        .output()
        .unwrap();
    assert_ok(&out);
    assert!(warnings(&out).is_empty(), "{}", stderr(&out));
    let out = Command::new(runner)
        .args(gen)
        .args(["-c", "300"])
        .output()
        .unwrap();
    assert_one_line_error(
        &out,
        "compiled for a context of at most 256; compile one with `modelc compile MODEL -c 300`",
    );
    let model = model().unwrap();
    let out = modelc()
        .arg("run")
        .arg(&model)
        .args(gen)
        .args(["-c", "9000"])
        .output()
        .unwrap();
    assert_ok(&out);
    let w = warnings(&out);
    assert_eq!(w.len(), 1, "{}", stderr(&out));
    assert!(w[0].contains("training context (8192)"), "{}", w[0]);
    // 4e9 tokens of KV cache: about 84 TiB.
    for backend in ["cpu", "interp"] {
        let out = modelc()
            .arg("run")
            .arg(&model)
            .args(gen)
            .args(["--backend", backend, "-c", "4000000000"])
            .output()
            .unwrap();
        assert_one_line_error(&out, "memory");
    }
}

/// llama.cpp's other spellings: `-fa 0/1/enabled/disabled`, `-ctk=q8_0`; KV cache type and
/// `--chunks` mistakes are one line each; the runner's `perplexity` and `bench` take `-fa`.
#[test]
fn flash_attn_spellings_cache_types_and_chunks() {
    let missing = "/nonexistent/model.gguf";
    for (args, want) in [
        (
            vec!["-ctk", "q4_0"],
            "-ctk q4_0 -ctv f16: the cpu target does not read this KV cache (it reads -ctk/-ctv f32/f32, f16/f16",
        ),
        (vec!["-ctk=garbage"], "unknown KV cache type 'garbage'"),
        (
            vec!["-ctk", "f32", "-ctv", "f16"],
            "the cpu target does not read this KV cache",
        ),
        (vec!["-ctv", "q8_0", "-fa", "0"], "needs flash attention"),
        (vec!["-fa", "sometimes"], "expected on, off or auto"),
    ] {
        let out = modelc()
            .args(["run", missing, "-p", "x"])
            .args(&args)
            .output()
            .unwrap();
        assert_one_line_error(&out, want);
    }
    let Some(m) = model() else { return };
    for fa in ["1", "enabled", "0", "disabled", "auto"] {
        let out = modelc()
            .arg("run")
            .arg(&m)
            .args(["-p", "hi", "-n", "2", "--temp", "0", "-fa", fa])
            .output()
            .unwrap();
        assert_ok(&out);
    }
    let out = modelc()
        .arg("run")
        .arg(&m)
        .args([
            "-p",
            "hi",
            "-n",
            "2",
            "--temp",
            "0",
            "-ctk=q8_0",
            "-ctv=q8_0",
        ])
        .output()
        .unwrap();
    assert_ok(&out);
    let Some(r) = runner() else { return };
    let text = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../README.md");
    let out = Command::new(r)
        .arg("perplexity")
        .arg("-f")
        .arg(&text)
        .args(["-c", "0"])
        .output()
        .unwrap();
    assert_one_line_error(&out, "-c must be above 0");
    let out = Command::new(r)
        .arg("perplexity")
        .arg("-f")
        .arg(&text)
        .args(["-c", "64", "--chunks", "0"])
        .output()
        .unwrap();
    assert_one_line_error(&out, "--chunks must be at least 1");
    let out = Command::new(r)
        .arg("perplexity")
        .arg("-f")
        .arg(&text)
        .args(["-c", "64", "--chunks", "1", "-fa", "off"])
        .output()
        .unwrap();
    assert_ok(&out);
    let out = Command::new(r)
        .args(["bench", "-p", "16", "-n", "0", "-r", "1", "-fa", "0"])
        .output()
        .unwrap();
    assert_ok(&out);
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(
        table.contains("| fa |") || table.contains(" fa |"),
        "{table}"
    );
}

/// `-lm` (llama.cpp's `--load-mode`) and older llama.cpp's `--no-mmap`: a bad mode, `dio` and
/// the two together are one-line errors; every mode the runtime implements gives the mapped
/// model's greedy text, in `modelc run` and in a runner.
#[test]
fn load_modes_read_or_map_the_same_model() {
    refused_up_front(
        &["-lm", "bogus"],
        "expected auto, none, mmap, mlock or mmap+mlock",
    );
    refused_up_front(&["-lm", "dio"], "direct I/O (dio) is not supported");
    refused_up_front(&["--no-mmap", "-lm", "mmap"], "cannot be used with");
    let Some(m) = model() else { return };
    let gen = [
        "-p",
        "The capital of France is",
        "-n",
        "6",
        "--temp",
        "0",
        "-t",
        "1",
    ];
    let text = |args: &[&str]| {
        let out = modelc()
            .arg("run")
            .arg(&m)
            .args(gen)
            .args(args)
            .output()
            .unwrap();
        assert_ok(&out);
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let mapped = text(&[]);
    assert!(!mapped.trim().is_empty());
    for args in [
        &["-lm", "none"][..],
        &["-lm=mmap"],
        &["--load-mode", "mlock"],
        &["-lm", "mmap+mlock"],
        &["--no-mmap"],
    ] {
        assert_eq!(text(args), mapped, "{args:?}");
    }
    let Some(r) = runner() else { return };
    let out = Command::new(r)
        .args(gen)
        .args(["-lm", "none"])
        .output()
        .unwrap();
    assert_ok(&out);
    assert_eq!(String::from_utf8_lossy(&out.stdout), mapped);
    // Refused as an argument: not blamed on the model file the runner was compiled for.
    let out = Command::new(r)
        .args(gen)
        .args(["-lm", "dio"])
        .output()
        .unwrap();
    assert_one_line_error(&out, "direct I/O (dio) is not supported");
    assert!(
        !stderr(&out).contains("could not be opened"),
        "{}",
        stderr(&out)
    );
}

/// Every numeric generation flag takes llama.cpp's range (`common/arg.cpp`,
/// `tools/completion` at 0c1e570) or is refused in one line that says modelc is stricter:
/// `--repeat-last-n` below 0 and `--repeat-penalty` 0, negative or infinite are refused as
/// llama.cpp refuses them; `--temp` / `--top-p` / `--min-p` NaN or infinite are refused
/// (llama.cpp takes them); `--temp -1` is greedy, `-c 3` warns and uses 8.
#[test]
fn numeric_flags_take_llama_cpp_ranges() {
    for (args, want) in [
        (
            &["--repeat-last-n", "-2"][..],
            "--repeat-last-n -2: must be 0 or more",
        ),
        (
            &["--repeat-last-n", "-1"][..],
            "--repeat-last-n -1: must be 0 or more",
        ),
        (
            &["--repeat-penalty", "0"][..],
            "--repeat-penalty 0: must be finite and greater than 0",
        ),
        (
            &["--repeat-penalty", "-1"][..],
            "--repeat-penalty -1: must be finite and greater than 0",
        ),
        (&["--repeat-penalty", "inf"][..], "--repeat-penalty inf"),
        (
            &["--temp", "nan"][..],
            "llama.cpp would take it; modelc is stricter",
        ),
        (
            &["--min-p=-inf"][..],
            "llama.cpp would take it; modelc is stricter",
        ),
        (
            &["--frequency-penalty", "nan"][..],
            "--frequency-penalty NaN: expected a finite number",
        ),
    ] {
        refused_up_front(args, want);
    }
    let Some(model) = model() else { return };
    let greedy = |extra: &[&str]| {
        let mut cmd = modelc();
        cmd.arg("run")
            .arg(&model)
            .args(["-p", "Once upon a time", "-n", "4", "--json"])
            .args(extra);
        json_output(&mut cmd)["tokens"].clone()
    };
    assert_eq!(greedy(&["--temp", "-1"]), greedy(&["--temp", "0"]));
    let out = modelc()
        .arg("run")
        .arg(&model)
        .args(["-p", "hi", "-n", "1", "--repeat-penalty", "1.1", "-c", "3"])
        .output()
        .unwrap();
    assert_ok(&out);
    assert_eq!(
        warnings(&out),
        ["modelc: warning: the minimum context size is 8; using 8 instead of -c 3"]
    );
    if let Some(runner) = runner() {
        let out = Command::new(runner)
            .args(["-p", "x", "--repeat-last-n", "-2"])
            .output()
            .unwrap();
        assert_one_line_error(&out, "--repeat-last-n -2: must be 0 or more");
    }
}

/// `compile -o` naming the model file itself (directly or through `./`) is refused before
/// anything is written; it used to replace the model with the runner.
#[test]
fn compile_refuses_to_overwrite_the_model() {
    let Some(model) = model() else { return };
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("cli_args_same_file");
    std::fs::create_dir_all(&dir).unwrap();
    let copy = dir.join("k.gguf");
    std::fs::copy(&model, &copy).unwrap();
    let before = std::fs::metadata(&copy).unwrap().len();
    for out in [copy.clone(), dir.join(".").join("k.gguf")] {
        let run = modelc()
            .arg("compile")
            .arg(&copy)
            .arg("-o")
            .arg(&out)
            .output()
            .unwrap();
        assert_one_line_error(&run, "is the model file itself");
        assert_eq!(std::fs::metadata(&copy).unwrap().len(), before);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// llama.cpp's `-m MODEL` in `modelc`'s subcommands (all spellings, anywhere on the line)
/// gives what the positional model gives; `-no-cnv` is accepted; a compile for a context
/// this machine cannot hold warns (once) and still writes the runner.
#[test]
fn model_flag_no_conversation_and_huge_compiled_context() {
    let Some(model) = model() else { return };
    let m = model.to_str().unwrap();
    let gen = [
        "-p",
        "Once upon a time",
        "-n",
        "4",
        "--temp",
        "0",
        "-t",
        "1",
    ];
    let plain = modelc().arg("run").arg(m).args(gen).output().unwrap();
    assert_ok(&plain);
    for line in [
        vec!["run", "-m", m],
        vec!["run", "--model", m],
        vec!["run", "-no-cnv", "--model=THE_MODEL"],
    ] {
        let line: Vec<String> = line.iter().map(|a| a.replace("THE_MODEL", m)).collect();
        let (head, tail) = line.split_at(1);
        let out = modelc().args(head).args(gen).args(tail).output().unwrap();
        assert_ok(&out);
        assert_eq!(out.stdout, plain.stdout, "{line:?}");
    }
    let out = modelc()
        .args(["detokenize", "19556", "905", "-m", m])
        .output()
        .unwrap();
    assert_ok(&out);
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "Hello world");
    let out = modelc().args(["run", "-m"]).output().unwrap();
    assert_one_line_error(&out, "'-m'");

    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("cli_args_huge_ctx");
    std::fs::create_dir_all(&dir).unwrap();
    let runner = dir.join("smol");
    let out = modelc()
        .args(["compile", m, "-o"])
        .arg(&runner)
        .args(["-c", "4000000000", "--ubatch", "1,16"])
        .output()
        .unwrap();
    assert_ok(&out);
    let w = warnings(&out);
    assert_eq!(w.len(), 1, "{}", stderr(&out));
    assert!(w[0].contains("could not run the runner"), "{}", w[0]);
    assert!(runner.exists());
    let _ = std::fs::remove_dir_all(&dir);
}

/// A runner refuses a model whose hyperparameters changed after it was compiled (they are
/// compiled into its program), not only one whose tensors changed.
#[test]
fn runner_refuses_changed_hyperparameters() {
    let Some(model) = model() else { return };
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("cli_args_hparams");
    std::fs::create_dir_all(&dir).unwrap();
    let copy = dir.join("m.gguf");
    std::fs::copy(&model, &copy).unwrap();
    let runner = dir.join("smol");
    let out = modelc()
        .arg("compile")
        .arg(&copy)
        .arg("-o")
        .arg(&runner)
        .args(["-c", "128", "--ubatch", "1,16"])
        .output()
        .unwrap();
    assert_ok(&out);
    let gen = ["-p", "hi", "-n", "2", "--temp", "0", "-t", "1"];
    assert_ok(&Command::new(&runner).args(gen).output().unwrap());
    // The f32 after a metadata key (its type tag, then the value) rewritten in place.
    let patch = |key: &str, value: f32| {
        let mut bytes = std::fs::read(&copy).unwrap();
        let at = bytes
            .windows(key.len())
            .position(|w| w == key.as_bytes())
            .unwrap_or_else(|| panic!("{key} not in the file"));
        let v = at + key.len() + 4;
        assert_eq!(
            &bytes[at + key.len()..v],
            &6u32.to_le_bytes(),
            "{key}: not an f32"
        );
        bytes[v..v + 4].copy_from_slice(&value.to_le_bytes());
        std::fs::write(&copy, bytes).unwrap();
    };
    patch("llama.rope.freq_base", 10.0);
    let out = Command::new(&runner).args(gen).output().unwrap();
    assert_one_line_error(&out, "its tensors or hyperparameters differ");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Output that cannot be written: a full stdout and stderr (`/dev/full`) end with status 1,
/// not an abort (a second panic while reporting the first); a closed pipe ends quietly with
/// SIGPIPE's status 141, also in a conversation (`-cnv`), whose writes return the error.
#[test]
fn unwritable_output_is_status_1_and_a_closed_pipe_141() {
    let Some(fixture) = modelc_tests::shared("fixtures/models/llama-sep-Q4_0.gguf") else {
        return;
    };
    let full = || {
        std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/full")
            .unwrap()
    };
    for args in [
        vec!["inspect"],
        vec!["run", "-p", "hi", "-n", "2", "-t", "1"],
    ] {
        let out = modelc()
            .args(&args[..1])
            .arg(&fixture)
            .args(&args[1..])
            .stdout(full())
            .stderr(full())
            .status()
            .unwrap();
        assert_eq!(out.code(), Some(1), "{args:?}");
    }
    let out = modelc()
        .arg("inspect")
        .arg(&fixture)
        .arg("--bogus")
        .stderr(full())
        .status()
        .unwrap();
    assert_eq!(out.code(), Some(1));
    // A conversation whose reader went away.
    let mut child = modelc()
        .arg("run")
        .arg(&fixture)
        .args(["-cnv", "-n", "64", "-t", "1", "--temp", "0"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    {
        use std::io::Write;
        let mut stdin = child.stdin.take().unwrap();
        let _ = stdin.write_all(b"tell me a story\n");
    }
    let out = child.wait_with_output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(141),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.stderr.is_empty() || !String::from_utf8_lossy(&out.stderr).contains("error"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `--samplers` / `--sampler-seq`: a name llama.cpp does not know is skipped with one
/// warning, as llama.cpp skips it; one of llama.cpp's samplers modelc does not have is
/// refused in one line.
#[test]
fn sampler_lists_skip_unknown_names_and_refuse_unsupported_ones() {
    let Some(fixture) = modelc_tests::shared("fixtures/models/llama-sep-Q4_0.gguf") else {
        return;
    };
    let run = |extra: &[&str]| {
        modelc()
            .arg("run")
            .arg(&fixture)
            .args(["-p", "hi", "-n", "2", "-t", "1"])
            .args(extra)
            .output()
            .unwrap()
    };
    let out = run(&["--samplers", "foo;top_k;temperature"]);
    assert_ok(&out);
    assert_eq!(
        warnings(&out),
        vec!["modelc: warning: --samplers: unknown sampler 'foo' (skipped)"]
    );
    let out = run(&["--sampler-seq", "ki"]);
    assert_one_line_error(
        &out,
        "--sampler-seq: the sampler 'i' is not supported by modelc",
    );
}

/// `bench -d` (llama-bench's `--n-depth`, issue 44): one row per depth and test, in
/// llama-bench's order (depth, then the prompt and generation tests) with its names
/// (`pp4 @ d8`) and its JSON field `n_depth`; a depth past the runner's compiled context is
/// one line.
#[test]
fn bench_depth_rows_and_names() {
    let Some(runner) = runner() else { return };
    let out = Command::new(runner)
        .args([
            "bench", "-p", "4", "-n", "2", "-d", "0,8", "-r", "1", "-t", "1", "--json",
        ])
        .output()
        .unwrap();
    assert_ok(&out);
    let rows: Value = serde_json::from_slice(&out.stdout).expect("JSON rows");
    let got: Vec<(String, u64, u64, u64)> = rows
        .as_array()
        .expect("an array")
        .iter()
        .map(|r| {
            (
                r["test"].as_str().unwrap_or("").to_string(),
                r["n_depth"].as_u64().unwrap_or(99),
                r["n_prompt"].as_u64().unwrap_or(99),
                r["n_gen"].as_u64().unwrap_or(99),
            )
        })
        .collect();
    let want = [
        ("pp4", 0, 4, 0),
        ("tg2", 0, 0, 2),
        ("pp4 @ d8", 8, 4, 0),
        ("tg2 @ d8", 8, 0, 2),
    ]
    .map(|(t, d, p, n)| (t.to_string(), d, p, n));
    assert_eq!(got, want);
    // The table's test column.
    let out = Command::new(runner)
        .args([
            "bench", "-p", "4", "-n", "0", "-d", "16", "-r", "1", "-t", "1",
        ])
        .output()
        .unwrap();
    assert_ok(&out);
    assert!(
        String::from_utf8_lossy(&out.stdout).contains(" pp4 @ d16 |"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let out = Command::new(runner)
        .args(["bench", "-p", "4", "-n", "0", "-d", "10000000", "-r", "1"])
        .output()
        .unwrap();
    assert_one_line_error(&out, "context");
}
