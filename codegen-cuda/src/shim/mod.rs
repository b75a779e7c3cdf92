//! The CPU shim: runs a generated step source, unchanged, on the host CPU, for tests.
//!
//! A CUDA source (`prelude.cuh` + kernels) or a Metal source (`prelude.metal` + the same
//! kernels) compiles with the host `g++` (C++20) against small headers that stand in for
//! `<cuda_fp16.h>` and `<metal_stdlib>` (`cuda_shim.h`, `metal_shim.h`), together with a
//! launch table generated here and `runner.cpp`, which reads the three buffers of the kernel
//! ABI ([`crate::program`]), runs the launches in order and writes `arena` and `kv` back.
//!
//! Threads of a block run concurrently with barrier semantics: by default as fibers (one
//! stack each, switched by hand; blocks spread over the cores), or, with
//! [`ShimOptions::os_threads`] or [`ShimOptions::tsan`], as OS threads meeting at real
//! barriers, so that ThreadSanitizer reports the races a missing `SYNC()` leaves
//! ([`ShimOptions::asan`] checks accesses outside the buffers). Shared
//! memory (`SHARED`) is a static of the worker (fibers) or of the process (OS threads; blocks
//! then run one at a time). A barrier that not every thread of the block (or a shuffle that
//! not every lane of the warp) reaches is an error, not a hang.
//!
//! Executables are cached under `$TMPDIR/modelc-shim` (or `$MODELC_SHIM_CACHE`), keyed by a
//! hash of everything compiled (`step.cu.cpp`/`step.metal.cpp` there is what g++ saw; the
//! cache is never pruned); the compiler is `g++` (or `$MODELC_CXX`). The executable takes
//! `MODELC_SHIM_WORKERS` (OS threads running blocks, default: the cores) and
//! `MODELC_SHIM_TIMING` (print each launch's time) from the environment.
//!
//! Cost (2 cores, shared): a launch of 1024 blocks of 128 threads with 7 barriers per
//! thread (5 of them shuffles) takes about 30 ms with fibers; OS threads are some 100 times
//! slower and TSan slower still, so sanitized runs want small grids. Compiling a step takes
//! a second or two, once.

use crate::program::{Launch, SIMD_WIDTH};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

const SHIM_ABI_H: &str = include_str!("shim_abi.h");
const CUDA_SHIM_H: &str = include_str!("cuda_shim.h");
const CUDA_FP16_H: &str = include_str!("cuda_fp16.h");
const METAL_SHIM_H: &str = include_str!("metal_shim.h");
const METAL_STDLIB: &str = include_str!("metal_stdlib");
const RUNNER_CPP: &str = include_str!("runner.cpp");

/// The shim's C++ files, written to the include directory of every compile.
const SHIM_FILES: [(&str, &str); 6] = [
    ("shim_abi.h", SHIM_ABI_H),
    ("cuda_shim.h", CUDA_SHIM_H),
    ("cuda_fp16.h", CUDA_FP16_H),
    ("metal_shim.h", METAL_SHIM_H),
    ("metal_stdlib", METAL_STDLIB),
    ("runner.cpp", RUNNER_CPP),
];

/// The language of a source: which prelude it starts with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Dialect {
    /// `prelude.cuh` ([`crate::CUDA_PRELUDE`]): kernels take the three buffers; thread and
    /// block indices are `threadIdx`/`blockIdx`.
    Cuda,
    /// `prelude.metal` (`codegen_metal::METAL_PRELUDE`): kernels take the three buffers, the
    /// threadgroup position and the thread index.
    Metal,
}

/// How [`run_step`] compiles and runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShimOptions {
    /// Compile with `-fsanitize=thread` and run threads as OS threads: a data race between
    /// the threads of a block (a missing `SYNC()`) fails the run with
    /// [`ShimError::Sanitizer`]. Slow: keep grids small.
    pub tsan: bool,
    /// Compile with `-fsanitize=address` (threads stay fibers, about half the speed): an
    /// access outside `arena`, `kv` or `wts` (each allocated at its exact size) fails the run
    /// with [`ShimError::Sanitizer`] naming the source line. Not together with `tsan`.
    pub asan: bool,
    /// Run a block's threads as OS threads instead of fibers (implied by `tsan`).
    pub os_threads: bool,
    /// Longest the executable may run before it is killed ([`ShimError::Timeout`]).
    pub timeout: Duration,
}

impl Default for ShimOptions {
    fn default() -> Self {
        ShimOptions {
            tsan: false,
            asan: false,
            os_threads: false,
            timeout: Duration::from_secs(300),
        }
    }
}

/// What can go wrong compiling or running a source. Every message is one line.
#[derive(Debug, thiserror::Error)]
pub enum ShimError {
    /// The C++ compiler could not be started.
    #[error(
        "cannot run the C++ compiler `{cxx}` ({err}): the GPU shim compiles kernels with the \
         host g++ (set MODELC_CXX to use another)"
    )]
    NoCompiler {
        /// The command tried.
        cxx: String,
        /// Why it did not start.
        err: std::io::Error,
    },
    /// A launch the GPU would refuse (names the launch and why).
    #[error("launch {index} ({kernel}): {msg}")]
    Launch {
        /// Its index in the launches.
        index: usize,
        /// Its kernel.
        kernel: String,
        /// What is wrong.
        msg: String,
    },
    /// The source did not compile: g++'s errors, and the file compiled.
    #[error("g++ failed on {path}: {diagnostics}")]
    Compile {
        /// The C++ file compiled (the source as given, then the launch table).
        path: PathBuf,
        /// g++'s error lines, joined.
        diagnostics: String,
    },
    /// The executable failed: a `runner:` error (a barrier not every thread reaches, an
    /// unknown kernel), a crash (an out-of-bounds access, a stack overflow), its exit status.
    #[error("the step failed ({status}): {stderr}")]
    Run {
        /// Exit status or signal.
        status: String,
        /// What it wrote to stderr, the relevant lines joined.
        stderr: String,
    },
    /// ThreadSanitizer or AddressSanitizer reported something (a data race between threads
    /// of a block, an access outside the buffers): its error and summary lines.
    #[error("sanitizer: {0}")]
    Sanitizer(String),
    /// Options that do not go together (`tsan` and `asan`).
    #[error("{0}")]
    Options(String),
    /// The executable ran past [`ShimOptions::timeout`].
    #[error("the step ran past the timeout of {0:?} and was killed")]
    Timeout(Duration),
    /// A file of the cache or of the run could not be written or read.
    #[error("{what}: {err}")]
    Io {
        /// What was being done, with the path.
        what: String,
        /// The error.
        err: std::io::Error,
    },
}

fn io_err(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> ShimError {
    let what = what.into();
    move |err| ShimError::Io { what, err }
}

/// Runs `launches` of `source` (a complete step source of `dialect`) on the CPU, in order,
/// over the three buffers of the kernel ABI: `arena` and `kv` are read and written, `wts` is
/// read. Compiles the source with the host g++ the first time (cached by content).
///
/// Each launch names a kernel of the source and gives its grid (`grid[0..3]` blocks, each at
/// least 1) and block (`block` threads, a multiple of 32 up to 1024, at most the `nt` of the
/// kernel's `KERNEL(name, nt)`); [`Launch::plan_kernel`] is not used.
///
/// # Errors
/// [`ShimError`]: no compiler, a launch the GPU would refuse, a compile error, a failed or
/// racy run, a timeout, or I/O on the cache or run files.
pub fn run_step(
    dialect: Dialect,
    source: &str,
    launches: &[Launch],
    arena: &mut [u8],
    kv: &mut [u8],
    wts: &[u8],
    opts: &ShimOptions,
) -> Result<(), ShimError> {
    if opts.tsan && opts.asan {
        return Err(ShimError::Options(
            "ShimOptions: tsan and asan cannot be combined".into(),
        ));
    }
    check_launches(source, launches)?;
    let exe = compile(dialect, source, launches, opts)?;
    run(&exe, launches, arena, kv, wts, opts)
}

fn check_launches(source: &str, launches: &[Launch]) -> Result<(), ShimError> {
    for (index, l) in launches.iter().enumerate() {
        let bad = |msg: String| ShimError::Launch {
            index,
            kernel: l.kernel.clone(),
            msg,
        };
        if l.kernel.is_empty()
            || l.kernel.starts_with(|c: char| c.is_ascii_digit())
            || !l
                .kernel
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_')
        {
            return Err(bad("not a kernel name".into()));
        }
        if l.block == 0 || l.block % SIMD_WIDTH != 0 || l.block > 1024 {
            return Err(bad(format!(
                "{} threads per block (a multiple of {SIMD_WIDTH}, at most 1024)",
                l.block
            )));
        }
        if l.grid.contains(&0) {
            return Err(bad(format!("an empty grid {:?}", l.grid)));
        }
        if l.grid[0] > i32::MAX as u32 || l.grid[1] > 65535 || l.grid[2] > 65535 {
            return Err(bad(format!(
                "grid {:?} exceeds CUDA's limits (2^31-1, 65535, 65535)",
                l.grid
            )));
        }
        if let Some(nt) = declared_threads(source, &l.kernel) {
            if l.block > nt {
                return Err(bad(format!(
                    "{} threads per block, but the kernel is KERNEL({}, {nt})",
                    l.block, l.kernel
                )));
            }
        }
    }
    Ok(())
}

/// The `nt` of `KERNEL(name, nt)` in `source`, if it is written with a literal.
fn declared_threads(source: &str, name: &str) -> Option<u32> {
    let pat = format!("KERNEL({name},");
    let at = source.find(&pat)? + pat.len();
    let rest = source[at..].trim_start();
    let end = rest
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(rest.len());
    rest[..end].parse().ok()
}

/// 128-bit FNV-1a (two 64-bit lanes with different offsets): a cache key, not a defence.
struct Key([u64; 2]);

impl Key {
    fn new() -> Key {
        Key([0xcbf2_9ce4_8422_2325, 0x6c62_272e_07bb_0142])
    }
    fn add(&mut self, bytes: &[u8]) -> &mut Key {
        for part in [&(bytes.len() as u64).to_le_bytes()[..], bytes] {
            for &b in part {
                for h in &mut self.0 {
                    *h = (*h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
                }
            }
        }
        self
    }
    fn hex(&self) -> String {
        format!("{:016x}{:016x}", self.0[0], self.0[1])
    }
}

fn cache_root() -> PathBuf {
    match std::env::var_os("MODELC_SHIM_CACHE") {
        Some(d) => PathBuf::from(d),
        None => std::env::temp_dir().join("modelc-shim"),
    }
}

fn cxx() -> String {
    std::env::var("MODELC_CXX").unwrap_or_else(|_| "g++".into())
}

static UNIQUE: AtomicU64 = AtomicU64::new(0);

/// A name no other writer (thread or process) uses at the same time.
fn unique(stem: &Path) -> PathBuf {
    let n = UNIQUE.fetch_add(1, Ordering::Relaxed);
    let mut s = stem.as_os_str().to_owned();
    s.push(format!(".tmp-{}-{n}", std::process::id()));
    PathBuf::from(s)
}

/// Writes `path` whole or not at all (concurrent writers of the same content are fine).
fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), ShimError> {
    if std::fs::read(path).is_ok_and(|old| old == bytes) {
        return Ok(());
    }
    let tmp = unique(path);
    std::fs::write(&tmp, bytes).map_err(io_err(format!("writing {}", tmp.display())))?;
    std::fs::rename(&tmp, path).map_err(io_err(format!("renaming to {}", path.display())))
}

fn flags(opts: &ShimOptions) -> Vec<&'static str> {
    let mut f = vec![
        "-std=c++20",
        "-pthread",
        "-Wno-attributes",
        "-fsigned-char",
        "-fno-strict-aliasing",
    ];
    if opts.tsan {
        f.extend(["-fsanitize=thread", "-O1", "-g", "-DSHIM_THREADS"]);
    } else if opts.asan {
        f.extend(["-fsanitize=address", "-O1", "-g", "-fno-omit-frame-pointer"]);
        if opts.os_threads {
            f.push("-DSHIM_THREADS");
        }
    } else if opts.os_threads {
        f.extend(["-O2", "-DSHIM_THREADS"]);
    } else {
        f.push("-O2");
    }
    f
}

/// Runs g++ with `args`; its errors as [`ShimError::Compile`] about `path`.
fn gxx(args: &[&std::ffi::OsStr], path: &Path) -> Result<(), ShimError> {
    let cxx = cxx();
    let out = Command::new(&cxx)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|err| ShimError::NoCompiler {
            cxx: cxx.clone(),
            err,
        })?;
    if out.status.success() {
        return Ok(());
    }
    let text = String::from_utf8_lossy(&out.stderr);
    let dir = path
        .parent()
        .map(|d| format!("{}/", d.display()))
        .unwrap_or_default();
    let errors: Vec<String> = text
        .lines()
        .filter(|l| l.contains("error:"))
        .map(|l| l.replace(&dir, ""))
        .collect();
    let mut diagnostics = errors
        .iter()
        .take(6)
        .cloned()
        .collect::<Vec<_>>()
        .join(" | ");
    if errors.len() > 6 {
        let _ = write!(diagnostics, " | … {} more errors", errors.len() - 6);
    }
    if diagnostics.is_empty() {
        diagnostics = last_lines(&text, 6);
    }
    Err(ShimError::Compile {
        path: path.to_path_buf(),
        diagnostics,
    })
}

fn last_lines(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    lines[lines.len().saturating_sub(n)..].join(" | ")
}

/// The launch table appended to the source: a wrapper per kernel that runs one thread.
/// The launch table: a wrapper per kernel the launches name and per kernel the source
/// defines (a line starting `KERNEL(name,`), so one executable serves every subset of a
/// source's launches (a kernel-by-kernel run compiles once).
fn launch_table(dialect: Dialect, source: &str, launches: &[Launch]) -> String {
    let mut names: Vec<&str> = launches.iter().map(|l| l.kernel.as_str()).collect();
    names.extend(source.lines().filter_map(|l| {
        let rest = l.strip_prefix("KERNEL(")?;
        let name = rest.split(',').next()?.trim();
        (!name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'))
            .then_some(name)
    }));
    names.sort_unstable();
    names.dedup();
    let mut s = String::from("\n#line 1 \"shim-launch-table\"\n");
    for n in &names {
        let call = match dialect {
            Dialect::Cuda => format!("{n}(a, k, w, *(const Operands*)o)"),
            Dialect::Metal => format!("{n}(a, k, w, *(const Operands*)o, uint3{{bx, by, bz}}, tx)"),
        };
        let _ = writeln!(
            s,
            "static void shim_call_{n}(unsigned char* a, unsigned char* k, const unsigned char* \
             w, const unsigned long long* o, unsigned bx, unsigned by, unsigned bz, unsigned tx) \
             {{ (void)o; (void)bx; (void)by; (void)bz; (void)tx; {call}; }}"
        );
    }
    s.push_str("extern \"C\" const shim_entry shim_table[] = {\n");
    for n in &names {
        let _ = writeln!(s, "    {{\"{n}\", shim_call_{n}}},");
    }
    if names.is_empty() {
        s.push_str("    {\"\", nullptr},\n");
    }
    let _ = writeln!(
        s,
        "}};\nextern \"C\" const int shim_table_len = {};",
        names.len()
    );
    s
}

/// Compiles the source and the launch table (and the runner, once per set of flags) into an
/// executable in the cache; returns its path.
fn compile(
    dialect: Dialect,
    source: &str,
    launches: &[Launch],
    opts: &ShimOptions,
) -> Result<PathBuf, ShimError> {
    let root = cache_root();
    let flags = flags(opts);
    let cxx = cxx();

    // The shim's files, in a directory named by their content.
    let mut k = Key::new();
    for (name, text) in SHIM_FILES {
        k.add(name.as_bytes()).add(text.as_bytes());
    }
    let inc = root.join(format!("shim-{}", k.hex()));
    std::fs::create_dir_all(&inc).map_err(io_err(format!("creating {}", inc.display())))?;
    for (name, text) in SHIM_FILES {
        write_atomic(&inc.join(name), text.as_bytes())?;
    }
    let mut inc_flag = std::ffi::OsString::from("-I");
    inc_flag.push(&inc);

    // The runner's object, per compiler and flags.
    k.add(cxx.as_bytes());
    for f in &flags {
        k.add(f.as_bytes());
    }
    let runner_o = inc.join(format!("runner-{}.o", k.hex()));
    if !runner_o.exists() {
        let tmp = unique(&runner_o);
        let runner_cpp = inc.join("runner.cpp");
        let mut args: Vec<&std::ffi::OsStr> = flags.iter().map(std::ffi::OsStr::new).collect();
        args.extend([
            inc_flag.as_os_str(),
            std::ffi::OsStr::new("-c"),
            runner_cpp.as_os_str(),
            std::ffi::OsStr::new("-o"),
            tmp.as_os_str(),
        ]);
        gxx(&args, &runner_cpp)?;
        std::fs::rename(&tmp, &runner_o)
            .map_err(io_err(format!("renaming to {}", runner_o.display())))?;
    }

    // The step: the source as given (its line numbers are the diagnostics'), then the table.
    let mut unit = String::with_capacity(source.len() + 1024);
    unit.push_str(source);
    unit.push_str(&launch_table(dialect, source, launches));
    k.add(format!("{dialect:?}").as_bytes())
        .add(unit.as_bytes());
    let dir = root.join(k.hex());
    let exe = dir.join("step");
    if exe.exists() {
        return Ok(exe);
    }
    std::fs::create_dir_all(&dir).map_err(io_err(format!("creating {}", dir.display())))?;
    let cpp = dir.join(match dialect {
        Dialect::Cuda => "step.cu.cpp",
        Dialect::Metal => "step.metal.cpp",
    });
    write_atomic(&cpp, unit.as_bytes())?;
    let tmp = unique(&exe);
    let mut args: Vec<&std::ffi::OsStr> = flags.iter().map(std::ffi::OsStr::new).collect();
    args.extend([
        inc_flag.as_os_str(),
        cpp.as_os_str(),
        runner_o.as_os_str(),
        std::ffi::OsStr::new("-o"),
        tmp.as_os_str(),
    ]);
    gxx(&args, &cpp)?;
    std::fs::rename(&tmp, &exe).map_err(io_err(format!("renaming to {}", exe.display())))?;
    Ok(exe)
}

/// Removes the run directory however the run ends.
struct RunDir(PathBuf);

impl Drop for RunDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn run(
    exe: &Path,
    launches: &[Launch],
    arena: &mut [u8],
    kv: &mut [u8],
    wts: &[u8],
    opts: &ShimOptions,
) -> Result<(), ShimError> {
    let dir = RunDir(unique(&cache_root().join("run")));
    let d = &dir.0;
    std::fs::create_dir_all(d).map_err(io_err(format!("creating {}", d.display())))?;
    let write = |name: &str, bytes: &[u8]| -> Result<PathBuf, ShimError> {
        let p = d.join(name);
        std::fs::write(&p, bytes).map_err(io_err(format!("writing {}", p.display())))?;
        Ok(p)
    };
    let arena_p = write("arena", arena)?;
    let kv_p = write("kv", kv)?;
    let wts_p = write("wts", wts)?;
    let mut list = String::new();
    for l in launches {
        let _ = write!(
            list,
            "{} {} {} {} {}",
            l.kernel, l.grid[0], l.grid[1], l.grid[2], l.block
        );
        for o in l.operand_array() {
            let _ = write!(list, " {o}");
        }
        list.push('\n');
    }
    let launches_p = write("launches", list.as_bytes())?;
    let err_p = d.join("stderr");
    let err_f =
        std::fs::File::create(&err_p).map_err(io_err(format!("creating {}", err_p.display())))?;

    let mut child = Command::new(exe)
        .args([&arena_p, &kv_p, &wts_p, &launches_p])
        .env("TSAN_OPTIONS", "exitcode=66 report_signal_unsafe=0")
        .env("ASAN_OPTIONS", "detect_leaks=0")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(err_f)
        .spawn()
        .map_err(io_err(format!("starting {}", exe.display())))?;
    let start = Instant::now();
    let mut nap = Duration::from_millis(1);
    let status = loop {
        if let Some(s) = child
            .try_wait()
            .map_err(io_err(format!("waiting for {}", exe.display())))?
        {
            break s;
        }
        if start.elapsed() > opts.timeout {
            let _ = child.kill();
            let _ = child.wait();
            return Err(ShimError::Timeout(opts.timeout));
        }
        std::thread::sleep(nap);
        nap = (nap * 2).min(Duration::from_millis(20));
    };
    let stderr = std::fs::read(&err_p).map_err(io_err(format!("reading {}", err_p.display())))?;
    let stderr = String::from_utf8_lossy(&stderr);
    if stderr.contains("ThreadSanitizer") || stderr.contains("AddressSanitizer") {
        return Err(ShimError::Sanitizer(sanitizer_summary(&stderr)));
    }
    if !status.success() {
        return Err(ShimError::Run {
            status: describe(status),
            stderr: runner_summary(&stderr),
        });
    }
    for (name, p, buf) in [("arena", &arena_p, arena), ("kv", &kv_p, kv)] {
        let bytes = std::fs::read(p).map_err(io_err(format!("reading {}", p.display())))?;
        if bytes.len() != buf.len() {
            return Err(ShimError::Run {
                status: describe(status),
                stderr: format!(
                    "{name} came back with {} bytes instead of {}",
                    bytes.len(),
                    buf.len()
                ),
            });
        }
        buf.copy_from_slice(&bytes);
    }
    Ok(())
}

fn describe(status: ExitStatus) -> String {
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        if let Some(sig) = status.signal() {
            let what = match sig {
                11 => " (SIGSEGV: an access outside the buffers, or a stack overflow)",
                7 => " (SIGBUS)",
                8 => " (SIGFPE: an integer division by zero)",
                6 => " (SIGABRT)",
                4 => " (SIGILL)",
                _ => "",
            };
            return format!("killed by signal {sig}{what}");
        }
    }
    status.to_string()
}

/// The sanitizer's warning, error and summary lines, and the runner's.
fn sanitizer_summary(text: &str) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut summaries = 0;
    for l in text.lines() {
        // `==1234==ERROR: AddressSanitizer: …` without its pid.
        let t = match l.trim().strip_prefix("==") {
            Some(r) => r.split_once("==").map_or(r, |(_, rest)| rest),
            None => l.trim(),
        };
        if let Some(r) = t
            .strip_prefix("WARNING: ")
            .or_else(|| t.strip_prefix("ERROR: "))
            .filter(|r| r.contains("Sanitizer:"))
        {
            parts.push(r.to_string());
        } else if let Some(r) = t.strip_prefix("SUMMARY: ") {
            summaries += 1;
            if summaries <= 3 {
                parts.push(r.to_string());
            }
        } else if t.starts_with("runner:") {
            parts.push(t.to_string());
        }
    }
    parts.dedup();
    if summaries > 3 {
        parts.push(format!("{summaries} reports in all"));
    }
    if parts.is_empty() {
        return last_lines(text, 6);
    }
    parts.join(" | ")
}

/// The runner's own error lines, or stderr's last lines.
fn runner_summary(text: &str) -> String {
    let lines: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| l.starts_with("runner:"))
        .collect();
    if lines.is_empty() {
        last_lines(text, 6)
    } else {
        lines.join(" | ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn declared_threads_reads_the_literal() {
        let src = "KERNEL(k0_sum, 128) {}\nKERNEL(k1, 64){}";
        assert_eq!(declared_threads(src, "k0_sum"), Some(128));
        assert_eq!(declared_threads(src, "k1"), Some(64));
        assert_eq!(declared_threads(src, "k2"), None);
    }

    #[test]
    fn launch_table_has_a_wrapper_per_kernel() {
        let l = |k: &str| Launch {
            kernel: k.into(),
            plan_kernel: 0,
            grid: [1, 1, 1],
            block: 32,
            operands: Vec::new(),
        };
        let t = launch_table(
            Dialect::Metal,
            "KERNEL(kc, 32) {}\n",
            &[l("kb"), l("ka"), l("kb")],
        );
        assert_eq!(t.matches("static void shim_call_").count(), 3);
        assert!(t.contains("ka(a, k, w, *(const Operands*)o, uint3{bx, by, bz}, tx)"));
        assert!(t.contains("kc(a, k, w, *(const Operands*)o, uint3{bx, by, bz}, tx)"));
        assert!(t.contains("shim_table_len = 3"));
    }
}
