//! The model file's pages leave the resident set once the engine has copied the weights
//! (`GgufFile::release_pages`, `runtime::engine_weights::ReleasingGguf`), and the bytes stay
//! readable. Resident pages are read from `/proc/self/smaps` (Linux only): the `Rss` of the
//! mapping that holds the file.

#![cfg(target_os = "linux")]

use ir::ggml::GgmlType;
use ir::gguf::{GgufFile, GgufWriter};
use std::path::PathBuf;

/// KiB of the mapping that contains `addr` resident in this process, from `/proc/self/smaps`.
fn resident_kib(addr: *const u8) -> u64 {
    let smaps = std::fs::read_to_string("/proc/self/smaps").expect("/proc/self/smaps readable");
    let addr = addr as u64;
    let mut inside = false;
    for line in smaps.lines() {
        let head = line.split_whitespace().next().unwrap_or("");
        if let Some((lo, hi)) = head.split_once('-') {
            if let (Ok(lo), Ok(hi)) = (u64::from_str_radix(lo, 16), u64::from_str_radix(hi, 16)) {
                inside = lo <= addr && addr < hi;
                continue;
            }
        }
        if inside {
            if let Some(kib) = line.strip_prefix("Rss:") {
                let kib = kib.trim().trim_end_matches("kB").trim();
                return kib.parse().expect("Rss is a number of kB");
            }
        }
    }
    panic!("no mapping holds address {addr:#x}");
}

fn checksum(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// A GGUF file with two F32 tensors (4 MiB and 1 MiB) in the temp folder, deleted on drop.
struct TempGguf(PathBuf);

impl TempGguf {
    fn new(tag: &str) -> TempGguf {
        let path =
            std::env::temp_dir().join(format!("modelc-memory-{tag}-{}.gguf", std::process::id()));
        let mut w = GgufWriter::new();
        let big: Vec<u8> = (0..1u32 << 20)
            .flat_map(|i| (i as f32 * 0.5).to_le_bytes())
            .collect();
        let small: Vec<u8> = (0..1u32 << 18)
            .flat_map(|i| (-(i as f32)).to_le_bytes())
            .collect();
        w.add_tensor("big", &[1024, 1024], GgmlType::F32, big)
            .expect("big tensor");
        w.add_tensor("small", &[512, 512], GgmlType::F32, small)
            .expect("small tensor");
        w.write_to_file(&path).expect("temp GGUF written");
        TempGguf(path)
    }
}

impl Drop for TempGguf {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[test]
fn released_pages_leave_the_resident_set_and_keep_their_bytes() {
    let tmp = TempGguf::new("release");
    let gguf = GgufFile::open(&tmp.0).expect("temp GGUF opens");
    let big = gguf.tensor("big").expect("big").clone();
    let small = gguf.tensor("small").expect("small").clone();
    let data = gguf.tensor_data(&big);
    let sum_big = checksum(data);
    let sum_small = checksum(gguf.tensor_data(&small));
    let before = resident_kib(data.as_ptr());
    assert!(
        before >= 5 * 1024,
        "reading both tensors made only {before} KiB resident"
    );

    // One tensor: its pages go, the other's stay.
    assert_eq!(
        gguf.release_tensor_pages(&big).expect("madvise"),
        big.n_bytes
    );
    let after_big = resident_kib(data.as_ptr());
    assert!(
        after_big <= 1024 + 2 * 4,
        "{after_big} KiB resident after releasing the 4 MiB tensor (the 1 MiB one stays)"
    );
    assert!(after_big >= 1024 - 4, "the other tensor's pages went too");

    // Everything, then the bytes are read back unchanged.
    assert_eq!(gguf.release_all_pages().expect("madvise"), gguf.file_size());
    assert_eq!(resident_kib(data.as_ptr()), 0);
    assert_eq!(checksum(gguf.tensor_data(&big)), sum_big);
    assert_eq!(checksum(gguf.tensor_data(&small)), sum_small);
    assert!(resident_kib(data.as_ptr()) >= 5 * 1024);

    // Empty, clipped and foreign ranges.
    assert_eq!(gguf.release_pages(0, 10..10).expect("empty"), 0);
    assert_eq!(gguf.release_pages(7, 0..100).expect("no shard 7"), 0);
    let end = gguf.file_size();
    assert_eq!(
        gguf.release_pages(0, end - 8..end + 1000).expect("clipped"),
        8
    );
    let in_memory = GgufFile::from_bytes(std::fs::read(&tmp.0).expect("read")).expect("parses");
    assert_eq!(in_memory.release_all_pages().expect("no map"), 0);
}

/// SmolLM2-135M Q4_1, or `None` after a recorded skip ([`modelc_tests::smollm2`]). The
/// engine build is slow in debug builds: this runs in release builds (or with
/// `MODELC_FULL_TESTS=1`), a deliberate opt-in that is not a skip for missing data.
fn smollm2() -> Option<GgufFile> {
    if cfg!(debug_assertions) && std::env::var_os("MODELC_FULL_TESTS").is_none() {
        eprintln!(
            "not run: the SmolLM2 engine test is slow in debug builds; run it with \
             `cargo test --release -p runtime --test memory` or MODELC_FULL_TESTS=1"
        );
        return None;
    }
    modelc_tests::smollm2().map(|p| GgufFile::open(p).expect("SmolLM2 opens"))
}

/// The runner's way of building the CPU engine for SmolLM2 with repacked weights (the fast
/// kernels; in the exact order SmolLM2's Q4_1 and Q8_0 weights are read in place from the
/// mapped file instead, and repacked types are Q4_0, the K-quants, IQ4_NL) leaves (almost)
/// none of the file's 92 MiB resident, after the load and after decoding, and the engine
/// computes the same logits as one built from the plain file (whose pages all stay
/// resident).
#[test]
fn smollm2_engine_keeps_no_file_pages_resident() {
    use codegen_cpu::SumOrder;
    use ir::graph::KvTypes;
    use runtime::cpu_engine::{build_plan, CpuEngine, LogitRows};
    use runtime::engine::Engine;
    use runtime::engine_weights::ReleasingGguf;

    /// What may stay: a few pages of embedding rows and the loader's last reads.
    const SLACK_KIB: u64 = 8 * 1024;
    let Some(gguf) = smollm2() else { return };
    let model = compiler::load_model(&gguf).expect("model lowers");
    let plan = build_plan(&model, &[1, 16], 64, KvTypes::F16, LogitRows::Last).expect("plan");
    let embd = gguf.tensor("token_embd.weight").expect("embedding table");
    let at = gguf.tensor_data(embd).as_ptr();
    let prompt = [
        504u32, 1573, 33059, 9318, 418, 260, 5595, 282, 260, 25959, 28, 284,
    ];
    let run = |e: &mut dyn Engine| -> Vec<f32> {
        let mut e = runtime::session::Session::single(e).expect("session");
        let mut out = e.decode(&prompt, 0, false).expect("prompt").to_vec();
        for (i, t) in [897u32, 3163, 28].into_iter().enumerate() {
            out.extend_from_slice(e.decode(&[t], prompt.len() + i, false).expect("step"));
        }
        out
    };

    let weights = ReleasingGguf::new(&gguf);
    let mut engine = weights
        .while_loading(std::time::Duration::from_millis(2), || {
            CpuEngine::with_sum_order(&weights, plan.clone(), 2, SumOrder::Block)
        })
        .expect("engine builds");
    let loaded = resident_kib(at);
    let released = run(&mut engine);
    let decoded = resident_kib(at);
    drop(engine);
    eprintln!("file pages resident: {loaded} KiB after the load, {decoded} KiB after decoding");
    assert!(
        loaded <= SLACK_KIB && decoded <= SLACK_KIB,
        "{loaded} / {decoded} KiB of the file stay resident (at most {SLACK_KIB})"
    );

    // Built from the plain file, the pages stay: what this test would see without release.
    let mut plain =
        CpuEngine::with_sum_order(&gguf, plan, 2, SumOrder::Block).expect("engine builds");
    let kept = resident_kib(at);
    assert!(
        kept >= 64 * 1024,
        "only {kept} KiB resident without release: this test cannot tell the difference"
    );
    assert!(
        run(&mut plain) == released,
        "releasing the file's pages changed the logits"
    );
}

/// Runs `cmd` under `ulimit -v KIB` (through `sh`), returning (status, stderr).
fn under_ulimit_v(kib: u64, cmd: &std::path::Path, args: &[&str]) -> (Option<i32>, String) {
    let mut script = format!("ulimit -v {kib}; exec \"$0\"");
    for i in 1..=args.len() {
        script.push_str(&format!(" \"${i}\""));
    }
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg(script)
        .arg(cmd)
        .args(args)
        .env("RUST_BACKTRACE", "1")
        .output()
        .expect("sh runs");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The one line an allocation failure must give: exit 1 (not SIGABRT), naming the bytes
/// asked for and the address-space limit.
fn assert_one_line_oom(what: &str, (code, stderr): (Option<i32>, String)) {
    assert_eq!(code, Some(1), "{what}: status {code:?}, stderr:\n{stderr}");
    let lines: Vec<&str> = stderr.lines().filter(|l| l.contains("error")).collect();
    assert_eq!(lines.len(), 1, "{what}: stderr:\n{stderr}");
    assert!(
        (lines[0].contains("failed to allocate") || lines[0].contains("needs"))
            && lines[0].contains("ulimit -v 293.0 MiB"),
        "{what}: {}",
        lines[0]
    );
    assert!(!stderr.contains("backtrace"), "{what}: {stderr}");
}

/// Under `ulimit -v 300000` (293 MiB, less than the engine needs), `modelc run` and a compiled
/// runner end with one line naming the memory asked for and available, and status 1
/// (llama.cpp: "failed to allocate buffer of size …"), not Rust's abort.
#[test]
fn allocation_failure_is_one_line_and_status_1() {
    let Some(model) = modelc_tests::smollm2() else {
        return;
    };
    let modelc = std::path::Path::new(env!("CARGO_BIN_EXE_modelc"));
    let m = model.to_str().expect("utf-8 path");
    assert_one_line_oom(
        "modelc run",
        under_ulimit_v(
            300_000,
            modelc,
            &["run", m, "-p", "hi", "-n", "2", "--temp", "0"],
        ),
    );
    let dir = std::env::temp_dir().join(format!("modelc-oom-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let runner = dir.join("smol");
    let out = std::process::Command::new(modelc)
        .args(["compile", m, "-c", "256", "-o"])
        .arg(&runner)
        .output()
        .expect("compile runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let got = under_ulimit_v(300_000, &runner, &["-p", "hi", "-n", "2", "--temp", "0"]);
    let _ = std::fs::remove_dir_all(&dir);
    assert_one_line_oom("runner", got);
}

/// A context far larger than the machine is refused before anything is allocated, in one
/// line naming both sizes.
#[test]
fn huge_context_is_refused_in_one_line() {
    let Some(model) = modelc_tests::smollm2() else {
        return;
    };
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_modelc"))
        .arg("run")
        .arg(&model)
        .args(["-p", "hi", "-n", "2", "-c", "16777216"])
        .env("RUST_BACKTRACE", "1")
        .output()
        .expect("modelc runs");
    let err = String::from_utf8_lossy(&out.stderr);
    // 360 GiB of KV cache.
    assert_eq!(out.status.code(), Some(1), "{err}");
    let lines: Vec<&str> = err.lines().filter(|l| l.contains("error")).collect();
    assert_eq!(lines.len(), 1, "{err}");
    assert!(
        lines[0].contains("needs") && lines[0].contains("RAM"),
        "{err}"
    );
}
