//! How much memory this process may use, for messages and up-front checks: the machine's
//! RAM (`/proc/meminfo`), the address-space limit (`ulimit -v`, `RLIMIT_AS`, from
//! `/proc/self/limits`) and the cgroup's limit (cgroup v2 `memory.max` or cgroup v1
//! `memory.limit_in_bytes`). Each is `None` where it cannot be read (another OS, no limit set).
//!
//! It also holds [`ReportingAlloc`], the global allocator of the `modelc` binary and of every
//! runner: an allocation that fails ends the process with one line naming the bytes asked
//! for and the memory available, and exit status 1 (llama.cpp: "failed to allocate buffer of
//! size …", exit 1), instead of Rust's default `memory allocation of N bytes failed` and
//! SIGABRT. Allocations whose failure the caller handles run inside [`fallible`].

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::OnceLock;

/// Bytes of RAM and swap of this machine (`MemTotal` + `SwapTotal`).
pub fn machine_bytes() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kib = |key: &str| {
        info.lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
    };
    Some((kib("MemTotal:")? + kib("SwapTotal:").unwrap_or(0)) * 1024)
}

/// The soft address-space limit (`ulimit -v`, `RLIMIT_AS`) in bytes, if one is set.
pub fn address_space_limit() -> Option<u64> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max address space"))?;
    let soft = line["Max address space".len()..]
        .split_whitespace()
        .next()?;
    soft.parse().ok()
}

/// Limits at or above this many bytes mean "no limit" (cgroup v1 writes
/// `9223372036854771712` for that).
const UNLIMITED: u64 = 1 << 62;

/// The cgroup memory limit in bytes, if one is set: cgroup v2 (`memory.max`) or cgroup v1
/// (`memory/memory.limit_in_bytes`), as mounted in this process's namespace.
pub fn cgroup_limit() -> Option<u64> {
    [
        "/sys/fs/cgroup/memory.max",
        "/sys/fs/cgroup/memory/memory.limit_in_bytes",
    ]
    .iter()
    .filter_map(|p| std::fs::read_to_string(p).ok())
    .filter_map(|s| s.trim().parse::<u64>().ok())
    .filter(|&b| b < UNLIMITED)
    .min()
}

/// The smallest of the limits above: what this process may use at most.
pub fn limit_bytes() -> Option<u64> {
    [machine_bytes(), address_space_limit(), cgroup_limit()]
        .into_iter()
        .flatten()
        .min()
}

/// `b` bytes as `"1.5 GiB"` or, below 1 GiB, `"292.9 MiB"`.
pub fn human(b: u64) -> String {
    if b >= 1 << 30 {
        format!("{:.1} GiB", b as f64 / (1u64 << 30) as f64)
    } else {
        format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64)
    }
}

/// `"23.4 GiB RAM, ulimit -v 292.9 MiB, cgroup limit 2.0 GiB"`: the limits that are set;
/// `"unknown"` when none can be read.
pub fn available() -> String {
    let mut parts = Vec::new();
    if let Some(b) = machine_bytes() {
        parts.push(format!("{} RAM", human(b)));
    }
    if let Some(b) = address_space_limit() {
        parts.push(format!("ulimit -v {}", human(b)));
    }
    if let Some(b) = cgroup_limit() {
        parts.push(format!("cgroup limit {}", human(b)));
    }
    if parts.is_empty() {
        "unknown".into()
    } else {
        parts.join(", ")
    }
}

/// `"failed to allocate 28.7 MiB (this process may use: …)"`: the line of an allocation
/// failure, naming what was asked for and what is available ([`available`]).
pub fn alloc_failure(bytes: u64) -> String {
    format!(
        "failed to allocate {} (this process may use: {})",
        human(bytes),
        available()
    )
}

/// Address space a process takes beyond what it asks for itself (glibc's per-thread malloc
/// arenas reserve 64 MiB each, thread stacks, the executable), counted against `ulimit -v`.
const ADDRESS_SPACE_SLACK: u64 = 128 << 20;

/// What loading a model takes: `resident` bytes it allocates (weights as the engine holds
/// them, KV cache, work buffers) and `mapped` bytes of the model file it maps (counted against
/// `ulimit -v`, not RAM: its pages are released once read).
#[derive(Clone, Copy, Debug)]
pub struct Needs {
    /// Bytes allocated: weights, KV cache, work buffers.
    pub resident: u64,
    /// Bytes of the model file mapped.
    pub mapped: u64,
}

/// Refuses a context that cannot fit in the memory this process may use, with one line,
/// before anything is allocated (llama.cpp fails to allocate its buffers in that case, with
/// "failed to allocate buffer of size …" and exit 1): `needs.resident` against RAM and the
/// cgroup limit, that plus `needs.mapped` and some slack against `ulimit -v`.
///
/// # Errors
/// Either above its limit, naming what is needed and what is available.
pub fn check_fits(n_ctx: usize, needs: Needs) -> anyhow::Result<()> {
    let ram = [machine_bytes(), cgroup_limit()]
        .into_iter()
        .flatten()
        .min();
    let address = needs
        .resident
        .saturating_add(needs.mapped)
        .saturating_add(ADDRESS_SPACE_SLACK);
    let over = match (ram, address_space_limit()) {
        (Some(have), _) if needs.resident > have => Some((needs.resident, have, "memory")),
        (_, Some(have)) if address > have => Some((address, have, "address space")),
        _ => None,
    };
    if let Some((need, have, kind)) = over {
        anyhow::bail!(
            "a context of {n_ctx} tokens needs {} of {kind} for the weights, KV cache and buffers, more than the {} this process may use ({}); use a smaller -c",
            human(need),
            human(have),
            available()
        );
    }
    Ok(())
}

thread_local! {
    /// Set while [`fallible`] runs: a failed allocation is the caller's to report.
    static FALLIBLE: Cell<bool> = const { Cell::new(false) };
}

/// What [`ReportingAlloc`] prints after the size: the available memory, read once at start
/// ([`ReportingAlloc::prepare`]) because nothing may be allocated while reporting.
static AVAILABLE: OnceLock<String> = OnceLock::new();

/// Runs `f`, in which an allocation that fails is returned to its caller (`try_reserve`,
/// `alloc_zeroed` returning null) instead of ending the process ([`ReportingAlloc`]).
pub fn fallible<T>(f: impl FnOnce() -> T) -> T {
    let before = FALLIBLE.with(|c| c.replace(true));
    let out = f();
    FALLIBLE.with(|c| c.set(before));
    out
}

/// `Vec::try_reserve_exact` of `n` more elements inside [`fallible`], with
/// [`alloc_failure`]'s line and `what` (`"the weights"`) as the error.
///
/// # Errors
/// The allocation fails.
pub fn try_reserve<T>(v: &mut Vec<T>, n: usize, what: &str) -> anyhow::Result<()> {
    fallible(|| v.try_reserve_exact(n)).map_err(|_| {
        anyhow::anyhow!(
            "{} for {what}",
            alloc_failure((n as u64).saturating_mul(std::mem::size_of::<T>() as u64))
        )
    })
}

/// The global allocator of the `modelc` binary and its runners: the system allocator, except
/// that an allocation that fails outside [`fallible`] writes `modelc: error: failed to
/// allocate N MiB (this process may use: …)` to stderr and exits with status 1 (module doc).
pub struct ReportingAlloc;

impl ReportingAlloc {
    /// Reads the memory limits for the failure line; call once at start, before any large
    /// allocation.
    pub fn prepare() {
        let _ = AVAILABLE.set(available());
    }
}

#[cold]
fn report_and_exit(bytes: usize) -> ! {
    use std::io::Write;
    // Formatted into a stack buffer: the heap is what just failed.
    let mut buf = [0u8; 512];
    let mut cur = std::io::Cursor::new(&mut buf[..]);
    let b = bytes as f64;
    let _ = if bytes >= 1 << 30 {
        write!(
            cur,
            "modelc: error: failed to allocate {:.1} GiB",
            b / (1u64 << 30) as f64
        )
    } else {
        write!(
            cur,
            "modelc: error: failed to allocate {:.1} MiB",
            b / (1u64 << 20) as f64
        )
    };
    let _ = match AVAILABLE.get() {
        Some(a) => writeln!(cur, " (this process may use: {a})"),
        None => writeln!(cur),
    };
    let n = cur.position() as usize;
    let _ = std::io::stderr().write_all(&buf[..n]);
    std::process::exit(1)
}

fn check(p: *mut u8, bytes: usize) -> *mut u8 {
    if p.is_null() && !FALLIBLE.with(Cell::get) {
        report_and_exit(bytes);
    }
    p
}

// SAFETY: every call forwards to `System` with the same arguments; a null result is either
// returned as is or ends the process.
unsafe impl GlobalAlloc for ReportingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract, forwarded.
        check(unsafe { System.alloc(layout) }, layout.size())
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract, forwarded.
        check(unsafe { System.alloc_zeroed(layout) }, layout.size())
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract, forwarded.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller's contract, forwarded.
        check(unsafe { System.realloc(ptr, layout, new_size) }, new_size)
    }
}
