//! Compiling a step's CUDA C with NVRTC (loaded at run time through `cudarc`): one CUBIN per
//! target architecture (`sm_80`, `sm_90`) and PTX (`compute_80`) for every other GPU the
//! driver can JIT it for, with ptxas's resource report per kernel (registers, spills, stack,
//! shared memory).
//!
//! # Where NVRTC comes from
//!
//! `scripts/fetch-nvrtc` installs PyPI's `nvidia-cuda-nvrtc-cu12` and
//! `nvidia-cuda-runtime-cu12` wheels (the library and the `cuda_fp16.h` headers) into
//! `~/.cache/modelc/nvrtc` (or `$MODELC_NVRTC_HOME`). [`locate`] loads `libnvrtc.so.12` from
//! there by its full path before `cudarc` looks for it: `cudarc` opens the library by its bare
//! name, which the dynamic loader then resolves to the copy already loaded (same soname).
//! Without that folder, a library on the loader's path (`LD_LIBRARY_PATH`, a CUDA toolkit)
//! is used, with headers from `$CUDA_HOME/include` or `/usr/local/cuda/include`.
//!
//! Every failure is an [`NvrtcError`] in one line; an absent library is never a panic.

use crate::program::StepProgram;
use cudarc::nvrtc::sys;
use serde::{Deserialize, Serialize};
use std::ffi::{c_char, c_int, CStr, CString};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// The CUBIN architectures compiled by default (A100, H100/H200).
pub const DEFAULT_ARCHS: [u32; 2] = [80, 90];

/// The virtual architecture of the PTX fallback (any GPU from sm_80 on JIT-compiles it).
pub const DEFAULT_PTX_ARCH: u32 = 80;

/// What went wrong compiling with NVRTC. Every message is one line.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum NvrtcError {
    /// No usable NVRTC library or headers.
    #[error("NVRTC is not available: {0} (run scripts/fetch-nvrtc to install it into ~/.cache/modelc/nvrtc)")]
    Missing(String),
    /// The source did not compile: names the step, the architecture, the kernel whose code
    /// the first error is in (and its plan kernel), and carries NVRTC's log.
    #[error("{0}")]
    Compile(Box<CompileFailure>),
    /// An NVRTC call that failed outside compilation (out of memory, a bad option).
    #[error("NVRTC: {0}")]
    Api(String),
}

/// A source that did not compile ([`NvrtcError::Compile`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompileFailure {
    /// The step (`step-1x1.cu`).
    pub step: String,
    /// The target (`sm_90`, `compute_80`).
    pub arch: String,
    /// Where the first error is: `kernel k3_mul_mat (plan kernel 3)`, or `the prelude and
    /// helpers` before the first kernel.
    pub place: String,
    /// The kernel function the first error is in, if any.
    pub kernel: Option<String>,
    /// Its plan kernel, if a launch names it.
    pub plan_kernel: Option<u32>,
    /// NVRTC's log, its lines joined with ` | ` (capped): the message stays one line.
    pub summary: String,
    /// NVRTC's whole log.
    pub log: String,
}

impl std::fmt::Display for CompileFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}: {}: {}: {}",
            self.step, self.arch, self.place, self.summary
        )
    }
}

/// How [`compile_step`] compiles.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NvrtcOptions {
    /// Real architectures to make CUBINs for (`90` for `sm_90`).
    pub archs: Vec<u32>,
    /// Virtual architecture of the PTX (`80` for `compute_80`); `None` for no PTX.
    pub ptx_arch: Option<u32>,
    /// Folders searched for `#include` (the one with `cuda_fp16.h`).
    pub include_dirs: Vec<PathBuf>,
}

impl NvrtcOptions {
    /// The default architectures ([`DEFAULT_ARCHS`], [`DEFAULT_PTX_ARCH`]) with the headers
    /// [`locate`] found.
    ///
    /// # Errors
    /// What [`locate`] reports.
    pub fn new() -> Result<NvrtcOptions, NvrtcError> {
        let nv = locate()?;
        Ok(NvrtcOptions {
            archs: DEFAULT_ARCHS.to_vec(),
            ptx_arch: Some(DEFAULT_PTX_ARCH),
            include_dirs: vec![nv.include_dir.clone()],
        })
    }
}

/// What ptxas reports for one kernel on one architecture (`--ptxas-options=-v`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KernelResources {
    /// The kernel's function name.
    pub kernel: String,
    /// Its plan kernel (from the step's launches), if launched.
    pub plan_kernel: Option<u32>,
    /// The architecture (`sm_90`).
    pub arch: String,
    /// Registers per thread.
    pub registers: u32,
    /// Bytes of spill stores.
    pub spill_stores: u64,
    /// Bytes of spill loads.
    pub spill_loads: u64,
    /// Bytes of stack frame per thread.
    pub stack_frame: u64,
    /// Bytes of static shared memory per block.
    pub shared_bytes: u64,
}

/// One step compiled: its CUBINs, its PTX, and the kernels' resources.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CompiledStep {
    /// `(architecture, CUBIN)`, one per [`NvrtcOptions::archs`] (`("sm_90", bytes)`).
    pub cubins: Vec<(String, Vec<u8>)>,
    /// PTX for [`NvrtcOptions::ptx_arch`] (empty when none was asked for).
    pub ptx: String,
    /// Every kernel's resources on every CUBIN architecture.
    pub kernels: Vec<KernelResources>,
}

impl CompiledStep {
    /// The kernels that spill registers or use a stack frame, as `k3_x on sm_90: 16 bytes
    /// spill stores, ...` lines (empty when none does).
    pub fn spills(&self) -> Vec<String> {
        self.kernels
            .iter()
            .filter(|k| k.spill_stores + k.spill_loads + k.stack_frame > 0)
            .map(|k| {
                format!(
                    "{} on {}: {} bytes stack frame, {} bytes spill stores, {} bytes spill loads",
                    k.kernel, k.arch, k.stack_frame, k.spill_stores, k.spill_loads
                )
            })
            .collect()
    }
}

/// The NVRTC library in use and the headers found for it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Nvrtc {
    /// NVRTC's version `(major, minor)`.
    pub version: (i32, i32),
    /// Where the library was loaded from (`None`: by the loader's own search).
    pub lib: Option<PathBuf>,
    /// The folder holding `cuda_fp16.h`.
    pub include_dir: PathBuf,
}

/// The folder `scripts/fetch-nvrtc` installs the wheels into: `$MODELC_NVRTC_HOME`, else
/// `$XDG_CACHE_HOME/modelc/nvrtc`, else `~/.cache/modelc/nvrtc`.
pub fn nvrtc_home() -> Option<PathBuf> {
    if let Some(h) = std::env::var_os("MODELC_NVRTC_HOME").filter(|h| !h.is_empty()) {
        return Some(PathBuf::from(h));
    }
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .filter(|h| !h.is_empty())
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME")
                .filter(|h| !h.is_empty())
                .map(|h| PathBuf::from(h).join(".cache"))
        })?;
    Some(cache.join("modelc").join("nvrtc"))
}

/// Finds and loads NVRTC (module doc), once per process.
///
/// # Errors
/// [`NvrtcError::Missing`] when no library or no `cuda_fp16.h` is found, or the library is
/// older than CUDA 12.
pub fn locate() -> Result<&'static Nvrtc, NvrtcError> {
    static FOUND: OnceLock<Result<Nvrtc, NvrtcError>> = OnceLock::new();
    FOUND.get_or_init(load).as_ref().map_err(Clone::clone)
}

/// The library handle loaded by full path, kept for the process's lifetime so that
/// `cudarc`'s load by name finds it.
static PRELOADED: OnceLock<libloading::Library> = OnceLock::new();

fn load() -> Result<Nvrtc, NvrtcError> {
    let home = nvrtc_home();
    let mut lib_path = None;
    if let Some(h) = &home {
        let p = h.join("nvidia/cuda_nvrtc/lib/libnvrtc.so.12");
        if p.is_file() {
            // SAFETY: loading a shared library runs its initialisers; this is NVIDIA's
            // NVRTC from the wheel `scripts/fetch-nvrtc` installed, whose initialisers have
            // no preconditions. The handle is kept in a static and never closed, so symbols
            // resolved from it stay valid.
            let lib = unsafe { libloading::Library::new(&p) }
                .map_err(|e| NvrtcError::Missing(format!("{}: {e}", p.display())))?;
            let _ = PRELOADED.set(lib);
            lib_path = Some(p);
        }
    }
    // SAFETY: as above: this opens (and closes again) the NVRTC library by name, running
    // the initialisers of whichever libnvrtc the loader finds.
    if !unsafe { sys::is_culib_present() } {
        return Err(NvrtcError::Missing(format!(
            "libnvrtc.so.12 is neither in {} nor on the library path",
            home.map(|h| h.join("nvidia/cuda_nvrtc/lib").display().to_string())
                .unwrap_or_else(|| "~/.cache/modelc/nvrtc".into())
        )));
    }
    let version = guarded("nvrtcVersion", || {
        let (mut major, mut minor): (c_int, c_int) = (0, 0);
        // SAFETY: the library is present (checked above); both pointers are to live locals.
        let r = unsafe { sys::nvrtcVersion(&mut major, &mut minor) };
        check(r, "nvrtcVersion")?;
        Ok((major, minor))
    })?;
    if version.0 < 12 {
        return Err(NvrtcError::Missing(format!(
            "NVRTC {}.{} is too old (12.0 or later is needed for sm_90)",
            version.0, version.1
        )));
    }
    let mut candidates: Vec<PathBuf> = Vec::new();
    if let Some(h) = &home {
        candidates.push(h.join("nvidia/cuda_runtime/include"));
    }
    for var in ["CUDA_HOME", "CUDA_PATH"] {
        if let Some(v) = std::env::var_os(var).filter(|v| !v.is_empty()) {
            candidates.push(PathBuf::from(v).join("include"));
        }
    }
    candidates.push(PathBuf::from("/usr/local/cuda/include"));
    let include_dir = candidates
        .iter()
        .find(|d| d.join("cuda_fp16.h").is_file())
        .cloned()
        .ok_or_else(|| {
            NvrtcError::Missing(format!(
                "cuda_fp16.h is in none of {}",
                candidates
                    .iter()
                    .map(|d| d.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ))
        })?;
    Ok(Nvrtc {
        version,
        lib: lib_path,
        include_dir,
    })
}

/// Runs `f`, turning a panic inside `cudarc` (a symbol the loaded library lacks) into an
/// error.
fn guarded<T>(what: &str, f: impl FnOnce() -> Result<T, NvrtcError>) -> Result<T, NvrtcError> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f))
        .unwrap_or_else(|_| Err(NvrtcError::Api(format!("{what}: the NVRTC library failed"))))
}

/// An NVRTC status as a result.
fn check(r: sys::nvrtcResult, what: &str) -> Result<(), NvrtcError> {
    if r == sys::nvrtcResult::NVRTC_SUCCESS {
        Ok(())
    } else {
        Err(NvrtcError::Api(format!("{what}: {r:?}")))
    }
}

/// An NVRTC program, destroyed when dropped.
struct Program(sys::nvrtcProgram);

impl Drop for Program {
    fn drop(&mut self) {
        // SAFETY: `self.0` was created by nvrtcCreateProgram and is destroyed only here.
        let _ = unsafe { sys::nvrtcDestroyProgram(&mut self.0) };
    }
}

impl Program {
    /// The program's log (empty when it has none).
    fn log(&self) -> Result<String, NvrtcError> {
        let mut n = 0usize;
        // SAFETY: a live program; `n` is a live local.
        check(
            unsafe { sys::nvrtcGetProgramLogSize(self.0, &mut n) },
            "nvrtcGetProgramLogSize",
        )?;
        let mut buf = vec![0u8; n.max(1)];
        // SAFETY: `buf` holds the `n` bytes (terminator included) the size call reported.
        check(
            unsafe { sys::nvrtcGetProgramLog(self.0, buf.as_mut_ptr() as *mut c_char) },
            "nvrtcGetProgramLog",
        )?;
        Ok(c_bytes_to_string(buf))
    }

    /// The compiled CUBIN.
    fn cubin(&self) -> Result<Vec<u8>, NvrtcError> {
        let mut n = 0usize;
        // SAFETY: a compiled program; `n` is a live local.
        check(
            unsafe { sys::nvrtcGetCUBINSize(self.0, &mut n) },
            "nvrtcGetCUBINSize",
        )?;
        let mut buf = vec![0u8; n];
        // SAFETY: `buf` holds the `n` bytes the size call reported.
        check(
            unsafe { sys::nvrtcGetCUBIN(self.0, buf.as_mut_ptr() as *mut c_char) },
            "nvrtcGetCUBIN",
        )?;
        Ok(buf)
    }

    /// The compiled PTX.
    fn ptx(&self) -> Result<String, NvrtcError> {
        let mut n = 0usize;
        // SAFETY: a compiled program; `n` is a live local.
        check(
            unsafe { sys::nvrtcGetPTXSize(self.0, &mut n) },
            "nvrtcGetPTXSize",
        )?;
        let mut buf = vec![0u8; n.max(1)];
        // SAFETY: `buf` holds the `n` bytes (terminator included) the size call reported.
        check(
            unsafe { sys::nvrtcGetPTX(self.0, buf.as_mut_ptr() as *mut c_char) },
            "nvrtcGetPTX",
        )?;
        Ok(c_bytes_to_string(buf))
    }
}

/// A NUL-terminated buffer as text.
fn c_bytes_to_string(mut buf: Vec<u8>) -> String {
    if let Some(end) = buf.iter().position(|&b| b == 0) {
        buf.truncate(end);
    }
    String::from_utf8_lossy(&buf).into_owned()
}

/// The file name a step's source is compiled (and written by `--emit-source`) as:
/// `step-<n_tokens>x<n_outputs>.cu`.
pub fn step_file_name(step: &StepProgram) -> String {
    format!("step-{}x{}.cu", step.n_tokens, step.n_outputs)
}

/// What one compile made.
struct Output {
    binary: Vec<u8>,
    ptx: String,
    log: String,
}

/// Compiles `source` for `arch` (`sm_90`: CUBIN; `compute_80`: PTX only).
fn compile_one(
    step: &StepProgram,
    name: &str,
    source: &CStr,
    arch: &str,
    include_dirs: &[PathBuf],
) -> Result<Output, NvrtcError> {
    let cname = CString::new(name).map_err(|e| NvrtcError::Api(e.to_string()))?;
    let mut opts: Vec<CString> = vec![
        format!("-arch={arch}"),
        "--ptxas-options=-v".into(),
        "-default-device".into(),
        "-std=c++17".into(),
    ]
    .into_iter()
    .chain(include_dirs.iter().map(|d| format!("-I{}", d.display())))
    .map(CString::new)
    .collect::<Result<_, _>>()
    .map_err(|e| NvrtcError::Api(format!("an option holds a NUL byte: {e}")))?;
    if arch.starts_with("compute_") {
        // PTX only: ptxas does not run, so its -v would be refused.
        opts.retain(|o| o.as_bytes() != b"--ptxas-options=-v");
    }
    let ptrs: Vec<*const c_char> = opts.iter().map(|o| o.as_ptr()).collect();
    let mut raw: sys::nvrtcProgram = std::ptr::null_mut();
    // SAFETY: `source` and `cname` are NUL-terminated and outlive the program (it is dropped
    // at the end of this function); no headers are passed (null arrays with a count of 0).
    let r = unsafe {
        sys::nvrtcCreateProgram(
            &mut raw,
            source.as_ptr(),
            cname.as_ptr(),
            0,
            std::ptr::null(),
            std::ptr::null(),
        )
    };
    check(r, "nvrtcCreateProgram")?;
    let prog = Program(raw);
    // SAFETY: a live program; `ptrs` points at the NUL-terminated strings of `opts`, which
    // outlive the call, and its length is the count passed.
    let r = unsafe { sys::nvrtcCompileProgram(prog.0, ptrs.len() as c_int, ptrs.as_ptr()) };
    let log = prog.log()?;
    if r == sys::nvrtcResult::NVRTC_ERROR_COMPILATION {
        return Err(compile_error(step, name, arch, source, log));
    }
    check(r, "nvrtcCompileProgram")?;
    let binary = if arch.starts_with("sm_") {
        prog.cubin()?
    } else {
        Vec::new()
    };
    let ptx = if arch.starts_with("compute_") {
        prog.ptx()?
    } else {
        String::new()
    };
    Ok(Output { binary, ptx, log })
}

/// The kernel functions of a source: `(first line, name)` of each `KERNEL(name, nt)` line,
/// lines counted from 1.
fn kernel_lines(source: &str) -> Vec<(usize, String)> {
    source
        .lines()
        .enumerate()
        .filter_map(|(i, l)| {
            let rest = l.trim_start().strip_prefix("KERNEL(")?;
            let name = rest.split(',').next()?.trim();
            (!name.is_empty()).then(|| (i + 1, name.to_string()))
        })
        .collect()
}

/// The error of a failed compile: the kernel holding NVRTC's first error line.
fn compile_error(
    step: &StepProgram,
    name: &str,
    arch: &str,
    source: &CStr,
    log: String,
) -> NvrtcError {
    let src = source.to_string_lossy();
    // NVRTC writes `step-1x1.cu(42): error: ...`.
    let first_line = log.lines().find_map(|l| {
        let rest = l.strip_prefix(name)?.strip_prefix('(')?;
        let (n, tail) = rest.split_once(')')?;
        tail.contains("error").then_some(n.parse::<usize>().ok()?)
    });
    let kernel = first_line.and_then(|line| {
        kernel_lines(&src)
            .into_iter()
            .rev()
            .find(|(l, _)| *l <= line)
            .map(|(_, k)| k)
    });
    let plan_kernel = kernel.as_ref().and_then(|k| {
        step.launches
            .iter()
            .find(|l| &l.kernel == k)
            .map(|l| l.plan_kernel)
    });
    let place = match (&kernel, plan_kernel, first_line) {
        (Some(k), Some(p), _) => format!("kernel {k} (plan kernel {p})"),
        (Some(k), None, _) => format!("kernel {k} (launched by no plan kernel)"),
        (None, _, Some(_)) => "the prelude and helpers".to_string(),
        (None, _, None) => "the source".to_string(),
    };
    const CAP: usize = 4000;
    let mut summary = log
        .lines()
        .map(str::trim_end)
        .filter(|l| !l.trim().is_empty())
        .collect::<Vec<_>>()
        .join(" | ");
    if summary.len() > CAP {
        let mut end = CAP;
        while !summary.is_char_boundary(end) {
            end -= 1;
        }
        summary.truncate(end);
        summary.push_str(" ...");
    }
    if summary.is_empty() {
        summary = "compilation failed with an empty log".into();
    }
    NvrtcError::Compile(Box::new(CompileFailure {
        step: name.to_string(),
        arch: arch.to_string(),
        place,
        kernel,
        plan_kernel,
        summary,
        log,
    }))
}

/// The per-kernel resources in a ptxas `-v` log for `arch`.
pub fn parse_ptxas_log(log: &str, arch: &str, step: &StepProgram) -> Vec<KernelResources> {
    let mut out: Vec<KernelResources> = Vec::new();
    let mut current: Option<usize> = None;
    let num_before = |s: &str, unit: &str| -> Option<u64> {
        // "... 12 bytes spill stores ..." → 12 for unit "bytes spill stores".
        let at = s.find(unit)?;
        s[..at].split_whitespace().last()?.parse().ok()
    };
    for line in log.lines() {
        let l = line.trim();
        if let Some(rest) = l.split_once("Compiling entry function '").map(|(_, r)| r) {
            let name = rest.split('\'').next().unwrap_or_default().to_string();
            let plan_kernel = step
                .launches
                .iter()
                .find(|x| x.kernel == name)
                .map(|x| x.plan_kernel);
            out.push(KernelResources {
                kernel: name,
                plan_kernel,
                arch: arch.to_string(),
                ..Default::default()
            });
            current = Some(out.len() - 1);
        } else if let Some(name) = l.split_once("Function properties for ").map(|(_, r)| r) {
            // Properties of a device function (not an entry) are not recorded.
            current = out.iter().position(|k| k.kernel == name.trim());
        } else if let Some(k) = current.and_then(|i| out.get_mut(i)) {
            if l.contains("bytes stack frame") {
                k.stack_frame = num_before(l, "bytes stack frame").unwrap_or(0);
                k.spill_stores = num_before(l, "bytes spill stores").unwrap_or(0);
                k.spill_loads = num_before(l, "bytes spill loads").unwrap_or(0);
            } else if l.contains("Used ") && l.contains(" registers") {
                k.registers = num_before(l, "registers").unwrap_or(0) as u32;
                k.shared_bytes = num_before(l, "bytes smem").unwrap_or(0);
            }
        }
    }
    out
}

/// Compiles one step's source (module doc): a CUBIN per [`NvrtcOptions::archs`], PTX for
/// [`NvrtcOptions::ptx_arch`], each in its own thread, and ptxas's report per kernel.
///
/// # Errors
/// [`NvrtcError::Missing`] without NVRTC, [`NvrtcError::Compile`] naming the kernel the
/// first error is in, or [`NvrtcError::Api`].
pub fn compile_step(step: &StepProgram, opts: &NvrtcOptions) -> Result<CompiledStep, NvrtcError> {
    locate()?;
    let name = step_file_name(step);
    let source = CString::new(step.source.as_bytes())
        .map_err(|_| NvrtcError::Api(format!("{name}: the source holds a NUL byte")))?;
    let mut targets: Vec<String> = opts.archs.iter().map(|a| format!("sm_{a}")).collect();
    if let Some(p) = opts.ptx_arch {
        targets.push(format!("compute_{p}"));
    }
    let results: Vec<Result<Output, NvrtcError>> = std::thread::scope(|s| {
        let handles: Vec<_> = targets
            .iter()
            .map(|arch| {
                let (name, source) = (&name, &source);
                s.spawn(move || {
                    guarded("nvrtcCompileProgram", || {
                        compile_one(step, name, source, arch, &opts.include_dirs)
                    })
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(NvrtcError::Api("a compile thread panicked".into())))
            })
            .collect()
    });
    let mut out = CompiledStep {
        cubins: Vec::new(),
        ptx: String::new(),
        kernels: Vec::new(),
    };
    for (arch, r) in targets.into_iter().zip(results) {
        let o = r?;
        if arch.starts_with("sm_") {
            out.kernels.extend(parse_ptxas_log(&o.log, &arch, step));
            out.cubins.push((arch, o.binary));
        } else {
            out.ptx = o.ptx;
        }
    }
    Ok(out)
}

/// Whether `path` looks like an NVRTC install of `scripts/fetch-nvrtc` (for messages).
pub fn is_fetched(home: &Path) -> bool {
    home.join("nvidia/cuda_nvrtc/lib/libnvrtc.so.12").is_file()
        && home
            .join("nvidia/cuda_runtime/include/cuda_fp16.h")
            .is_file()
}
