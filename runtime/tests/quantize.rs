//! `modelc quantize` against llama.cpp's `llama-quantize` (issue 12):
//!
//! - every SmolLM2 variant of `shared/reference/variants.json` (llama-quantize
//!   `--allow-requantize` from the Q4_1 file, 2 threads) gets exactly the listed sha256;
//! - every quantized fixture of `shared/fixtures/models/` (llama-quantize `--pure` from the
//!   F32 original) is reproduced byte for byte;
//! - bad input gets one line on stderr and status 1, and leaves no file behind;
//! - `--dry-run` prints the plan and writes nothing; the thread count changes no byte;
//! - with `LLAMA_QUANTIZE=path/to/llama-quantize`: every mix and the type flags on every
//!   fixture, against that binary.

use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn modelc() -> Command {
    Command::new(env!("CARGO_BIN_EXE_modelc"))
}

/// A fresh scratch folder for one test.
fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("modelc-quantize-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn quantize(args: &[&str], input: &Path, output: &Path, ftype: &str) -> Output {
    modelc()
        .arg("quantize")
        .args(args)
        .arg(input)
        .arg(output)
        .arg(ftype)
        .arg("2")
        .output()
        .unwrap()
}

/// Where two GGUF files first differ: the header, or the first tensor (in file order) whose
/// type, shape or data differs, with the index of its first differing block.
fn first_difference(ours: &Path, theirs: &Path) -> String {
    use ir::gguf::GgufFile;
    let (Ok(a), Ok(b)) = (GgufFile::open(ours), GgufFile::open(theirs)) else {
        return "one of the files does not parse".into();
    };
    let names = |f: &GgufFile| {
        f.tensors()
            .iter()
            .map(|t| t.name.clone())
            .collect::<Vec<_>>()
    };
    if names(&a) != names(&b) {
        return "tensor order or names".into();
    }
    for (ta, tb) in a.tensors().iter().zip(b.tensors()) {
        if ta.ggml_type != tb.ggml_type || ta.shape() != tb.shape() {
            return format!(
                "{}: {} {:?} vs {} {:?}",
                ta.name,
                ta.ggml_type,
                ta.shape(),
                tb.ggml_type,
                tb.shape()
            );
        }
        let (da, db) = (a.tensor_data(ta), b.tensor_data(tb));
        if let Some(i) = da.iter().zip(db).position(|(x, y)| x != y) {
            return format!(
                "{} ({}): first differing block {}",
                ta.name,
                ta.ggml_type,
                i / ta.ggml_type.type_size()
            );
        }
    }
    "metadata, tensor offsets or padding".into()
}

fn sha256(path: &Path) -> String {
    let mut h = Sha256::new();
    let mut f = std::fs::File::open(path).unwrap();
    std::io::copy(&mut f, &mut h).unwrap();
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

#[test]
fn smollm2_variants_have_llama_quantizes_sha256() {
    let (Some(src), Some(list)) = (
        modelc_tests::smollm2(),
        modelc_tests::shared("reference/variants.json"),
    ) else {
        return;
    };
    let list: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(list).unwrap()).unwrap();
    let dir = scratch("variants");
    let mut wrong = Vec::new();
    for v in list.as_array().unwrap() {
        if v["made_by"].is_null() {
            continue;
        }
        let ty = v["type"].as_str().unwrap();
        let out = dir.join(format!("{ty}.gguf"));
        let run = quantize(&["--allow-requantize"], &src, &out, ty);
        assert!(
            run.status.success(),
            "{ty}: {}",
            String::from_utf8_lossy(&run.stderr)
        );
        let size = std::fs::metadata(&out).unwrap().len();
        let sha = sha256(&out);
        if sha != v["sha256"].as_str().unwrap() || size != v["size_bytes"].as_u64().unwrap() {
            // llama-quantize's file, if the cache has it, says where.
            let theirs = modelc_tests::models_dir().join(v["file"].as_str().unwrap());
            let at = if theirs.exists() {
                first_difference(&out, &theirs)
            } else {
                "no llama-quantize file to compare".into()
            };
            wrong.push(format!("{ty} ({size} bytes, sha256 {sha}; {at})"));
        }
        std::fs::remove_file(&out).unwrap();
    }
    let _ = std::fs::remove_dir_all(&dir);
    assert!(wrong.is_empty(), "differ from llama-quantize: {wrong:?}");
}

#[test]
fn fixtures_are_reproduced_from_their_f32_originals() {
    let Some(models) = modelc_tests::shared("fixtures/models") else {
        return;
    };
    let dir = scratch("fixtures");
    let mut names: Vec<String> = std::fs::read_dir(&models)
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.ends_with(".gguf") && !n.ends_with("-F32.gguf"))
        .collect();
    names.sort();
    assert!(names.len() >= 23, "{names:?}");
    let mut wrong = Vec::new();
    for name in &names {
        let stem = name.trim_end_matches(".gguf");
        let (model, ty) = stem.rsplit_once('-').unwrap();
        // The fixtures' K-quant files are the `_S` mixes (their README).
        let ftype = match ty {
            "Q3_K" | "Q4_K" | "Q5_K" => format!("{ty}_S"),
            t => t.to_string(),
        };
        let out = dir.join(name);
        let run = quantize(
            &["--pure"],
            &models.join(format!("{model}-F32.gguf")),
            &out,
            &ftype,
        );
        assert!(
            run.status.success(),
            "{name}: {}",
            String::from_utf8_lossy(&run.stderr)
        );
        if std::fs::read(&out).unwrap() != std::fs::read(models.join(name)).unwrap() {
            wrong.push(format!(
                "{name}: {}",
                first_difference(&out, &models.join(name))
            ));
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    assert!(wrong.is_empty(), "differ from llama-quantize: {wrong:?}");
}

/// Status 1, exactly one line on stderr containing `what`, and no output file.
fn fails_with(out: &Output, what: &str, output: &Path) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains(what), "expected '{what}' in: {err}");
    assert!(!output.exists(), "{} was written", output.display());
    let mut tmp = output.as_os_str().to_owned();
    tmp.push(".tmp");
    assert!(!Path::new(&tmp).exists());
}

#[test]
fn bad_input_gets_one_line() {
    let Some(models) = modelc_tests::shared("fixtures/models") else {
        return;
    };
    let dir = scratch("errors");
    let f32 = models.join("llama-sep-F32.gguf");
    let q4 = models.join("llama-sep-Q4_0.gguf");
    let out = dir.join("out.gguf");

    fails_with(
        &quantize(&[], &f32, &out, "Q9_K"),
        "unknown quantization type",
        &out,
    );
    fails_with(
        &quantize(&[], &f32, &out, "IQ2_XXS"),
        "importance matrix",
        &out,
    );
    fails_with(
        &quantize(&[], &q4, &out, "Q8_0"),
        "requantizing from type Q4_0 is disabled",
        &out,
    );

    // Not a GGUF file at all, and a GGUF file without a model in it.
    let text = dir.join("notes.gguf");
    std::fs::write(&text, "not a model").unwrap();
    fails_with(&quantize(&[], &text, &out, "Q8_0"), "notes.gguf", &out);
    let empty = dir.join("empty.gguf");
    let mut w = ir::gguf::GgufWriter::new();
    w.add_kv("general.name", ir::gguf::Value::String("x".into()));
    w.write_to_file(&empty).unwrap();
    fails_with(&quantize(&[], &empty, &out, "Q8_0"), "not a model", &out);

    // An output that is not a regular file (a FIFO here; /dev/full once was replaced by a
    // regular file) is refused and left as it was.
    #[cfg(unix)]
    {
        let fifo = dir.join("fifo.gguf");
        let made = std::process::Command::new("mkfifo").arg(&fifo).status();
        assert!(made.is_ok_and(|s| s.success()), "mkfifo");
        let run = quantize(&[], &f32, &fifo, "Q8_0");
        assert_eq!(run.status.code(), Some(1));
        assert!(String::from_utf8_lossy(&run.stderr).contains("not a regular file"));
        assert!(!std::fs::symlink_metadata(&fifo).unwrap().is_file());
    }

    // Output equal to the input (also through another spelling of the path).
    let copy = dir.join("model.gguf");
    std::fs::copy(&f32, &copy).unwrap();
    let same = dir.join(".").join("model.gguf");
    let run = quantize(&[], &copy, &same, "Q8_0");
    assert_eq!(run.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&run.stderr).contains("the same"));
    assert_eq!(
        std::fs::read(&copy).unwrap(),
        std::fs::read(&f32).unwrap(),
        "the input was changed"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn dry_run_prints_the_plan_and_writes_nothing() {
    let Some(models) = modelc_tests::shared("fixtures/models") else {
        return;
    };
    let dir = scratch("dry-run");
    let out = dir.join("out.gguf");
    let run = quantize(
        &["--dry-run"],
        &models.join("llama-sep-F32.gguf"),
        &out,
        "Q4_K_M",
    );
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let text = String::from_utf8_lossy(&run.stdout);
    // 21 tensors; in Q4_K_M the output gets Q6_K, and so do the last layer's attn_v and
    // ffn_down (llama.cpp's use_more_bits(1, 2)), not the first layer's.
    assert_eq!(
        text.lines().filter(|l| l.starts_with('[')).count(),
        21,
        "{text}"
    );
    assert!(text.contains("output.weight"), "{text}");
    let line = |name: &str| {
        text.lines()
            .find(|l| l.contains(&format!(" {name} ")))
            .unwrap_or_default()
            .to_string()
    };
    assert!(line("output.weight").ends_with("(q6_k)"), "{text}");
    assert!(line("blk.1.attn_v.weight").ends_with("(q6_k)"), "{text}");
    assert!(line("blk.1.ffn_down.weight").ends_with("(q6_k)"), "{text}");
    assert!(line("blk.0.attn_v.weight").ends_with("(q4_k)"), "{text}");
    assert!(line("blk.0.attn_q.weight").ends_with("(q4_k)"), "{text}");
    assert!(line("output_norm.weight").contains("size ="), "{text}");
    assert!(text.contains("quant size"), "{text}");
    assert!(!out.exists());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn thread_count_does_not_change_the_bytes() {
    let Some(models) = modelc_tests::shared("fixtures/models") else {
        return;
    };
    let dir = scratch("threads");
    let src = models.join("qwen2-F32.gguf");
    // -1: every CPU, as llama-quantize takes a count of 0 or less.
    let files: Vec<Vec<u8>> = ["1", "3", "-1"]
        .iter()
        .map(|n| {
            let out = dir.join(format!("t{n}.gguf"));
            let run = modelc()
                .arg("quantize")
                .arg(&src)
                .arg(&out)
                .args(["Q4_K_M", n])
                .output()
                .unwrap();
            assert!(
                run.status.success(),
                "{}",
                String::from_utf8_lossy(&run.stderr)
            );
            std::fs::read(&out).unwrap()
        })
        .collect();
    assert!(files[0] == files[1], "1 and 3 threads differ");
    assert!(files[0] == files[2], "1 and all threads differ");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Every mix and the type flags on every fixture against the llama-quantize binary that
/// `LLAMA_QUANTIZE` names (llama.cpp commit 0c1e570; ~3 minutes on 2 cores). Opt-in, as it
/// needs llama.cpp built: `LLAMA_QUANTIZE=... cargo test --release -p runtime --test quantize
/// -- --ignored`.
#[test]
#[ignore = "needs a llama-quantize binary in LLAMA_QUANTIZE"]
fn mixes_equal_llama_quantize() {
    let Some(lq) = std::env::var_os("LLAMA_QUANTIZE") else {
        panic!("set LLAMA_QUANTIZE to a llama-quantize binary (llama.cpp 0c1e570)");
    };
    let Some(models) = modelc_tests::shared("fixtures/models") else {
        return;
    };
    let dir = scratch("mixes");
    let (want, got) = (dir.join("want.gguf"), dir.join("got.gguf"));
    let mixes = [
        "Q2_K", "Q3_K_S", "Q3_K_M", "Q3_K_L", "Q4_K_S", "Q4_K_M", "Q5_K_S", "Q5_K_M", "Q6_K",
        "IQ4_NL", "IQ4_XS", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "F16", "BF16", "F32",
    ];
    let flags: [&[&str]; 5] = [
        &["--leave-output-tensor"],
        &["--output-tensor-type", "q8_0"],
        &["--token-embedding-type", "q4_0"],
        &[
            "--output-tensor-type",
            "f16",
            "--token-embedding-type",
            "q6_k",
        ],
        &["--pure", "--leave-output-tensor"],
    ];
    let mut cases: Vec<(&str, &str, &[&str])> = Vec::new();
    for m in [
        "llama-sep",
        "llama-tied",
        "qwen2",
        "qwen3",
        "gemma3",
        "phi3",
    ] {
        cases.extend(mixes.iter().map(|&t| (m, t, &[][..])));
    }
    for f in flags {
        for m in ["llama-sep", "llama-tied"] {
            cases.extend(["Q4_K_M", "Q3_K_M"].map(|t| (m, t, f)));
        }
    }
    let mut wrong = Vec::new();
    for (m, t, f) in cases {
        let src = models.join(format!("{m}-F32.gguf"));
        let theirs = Command::new(&lq)
            .args(f)
            .arg(&src)
            .arg(&want)
            .args([t, "2"])
            .output()
            .unwrap();
        assert!(theirs.status.success(), "llama-quantize {m} {t} {f:?}");
        let ours = quantize(f, &src, &got, t);
        assert!(
            ours.status.success(),
            "{}",
            String::from_utf8_lossy(&ours.stderr)
        );
        if std::fs::read(&want).unwrap() != std::fs::read(&got).unwrap() {
            wrong.push(format!("{m} {t} {f:?}: {}", first_difference(&got, &want)));
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    assert!(wrong.is_empty(), "differ from llama-quantize: {wrong:?}");
}

#[test]
fn first_difference_names_the_tensor() {
    let Some(models) = modelc_tests::shared("fixtures/models") else {
        return;
    };
    let d = first_difference(
        &models.join("llama-sep-Q4_0.gguf"),
        &models.join("llama-sep-Q4_1.gguf"),
    );
    assert!(
        d.contains("Q4_0") && d.contains("Q4_1") && d.contains(".weight"),
        "{d}"
    );
    let dir = scratch("first-difference");
    let (a, b) = (dir.join("a.gguf"), dir.join("b.gguf"));
    let src = models.join("llama-sep-F32.gguf");
    assert!(quantize(&["--pure"], &src, &a, "Q8_0").status.success());
    let mut bytes = std::fs::read(&a).unwrap();
    let n = bytes.len();
    bytes[n - 100] ^= 1; // in the last tensor's data
    std::fs::write(&b, bytes).unwrap();
    let d = first_difference(&a, &b);
    assert!(d.contains("first differing block"), "{d}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The temporary file of the atomic write can neither be the input (`IN = OUT.tmp` used to
/// truncate the model and crash) nor follow a symlink planted at a predictable name, and a
/// huge thread count does not start threads without work (it used to run for minutes).
#[test]
fn the_write_never_clobbers_other_files() {
    let Some(models) = modelc_tests::shared("fixtures/models") else {
        return;
    };
    let dir = scratch("clobber");
    let src = std::fs::read(models.join("qwen2-F32.gguf")).unwrap();
    let input = dir.join("a.gguf.tmp");
    std::fs::write(&input, &src).unwrap();
    let run = quantize(&[], &input, &dir.join("a.gguf"), "Q4_0");
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    assert!(std::fs::read(&input).unwrap() == src, "the input changed");
    #[cfg(unix)]
    {
        let victim = dir.join("victim.txt");
        std::fs::write(&victim, b"keep").unwrap();
        std::os::unix::fs::symlink(&victim, dir.join("z.gguf.tmp")).unwrap();
        let run = quantize(&[], &input, &dir.join("z.gguf"), "Q8_0");
        assert!(
            run.status.success(),
            "{}",
            String::from_utf8_lossy(&run.stderr)
        );
        assert_eq!(std::fs::read(&victim).unwrap(), b"keep");
    }
    let run = modelc()
        .arg("quantize")
        .arg(&input)
        .arg(dir.join("t.gguf"))
        .args(["Q4_0", "99999999"])
        .output()
        .unwrap();
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let leftovers: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with('.'))
        .collect();
    assert!(leftovers.is_empty(), "temporary files left: {leftovers:?}");
    let _ = std::fs::remove_dir_all(&dir);
}
