//! How much memory this process may use, for messages and up-front checks: the machine's
//! RAM (`/proc/meminfo`), the address-space limit (`ulimit -v`, from `/proc/self/limits`) and
//! the cgroup's limit (`/sys/fs/cgroup/memory.max`, cgroup v2). Each is `None` where it cannot
//! be read (another OS, no limit set).

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

/// The cgroup v2 memory limit in bytes, if one is set.
pub fn cgroup_limit() -> Option<u64> {
    let s = std::fs::read_to_string("/sys/fs/cgroup/memory.max").ok()?;
    s.trim().parse().ok()
}

/// The smallest of the limits above: what this process may use at most.
pub fn limit_bytes() -> Option<u64> {
    [machine_bytes(), address_space_limit(), cgroup_limit()]
        .into_iter()
        .flatten()
        .min()
}

fn gib(b: u64) -> f64 {
    b as f64 / (1u64 << 30) as f64
}

/// `" (memory: … GiB RAM, ulimit -v … GiB, cgroup … GiB)"` for an allocation failure
/// message, naming the limits that are set; empty when none can be read.
pub fn available_note() -> String {
    let mut parts = Vec::new();
    if let Some(b) = machine_bytes() {
        parts.push(format!("{:.1} GiB RAM", gib(b)));
    }
    if let Some(b) = address_space_limit() {
        parts.push(format!("ulimit -v {:.1} GiB", gib(b)));
    }
    if let Some(b) = cgroup_limit() {
        parts.push(format!("cgroup limit {:.1} GiB", gib(b)));
    }
    if parts.is_empty() {
        String::new()
    } else {
        format!(
            " (this process may use: {}); use a smaller -c",
            parts.join(", ")
        )
    }
}

/// Refuses a context whose KV cache and work buffers (`bytes`) cannot fit in the memory
/// this process may use ([`limit_bytes`]), with one line, before anything is allocated
/// (llama.cpp fails to allocate its KV cache buffer in that case).
///
/// # Errors
/// `bytes` above the limit, naming both.
pub fn check_fits(n_ctx: usize, bytes: u64) -> anyhow::Result<()> {
    if let Some(have) = limit_bytes() {
        anyhow::ensure!(
            bytes <= have,
            "a context of {n_ctx} tokens needs {:.1} GiB for the KV cache and buffers, more than the {:.1} GiB of memory this process may use; use a smaller -c",
            gib(bytes),
            gib(have)
        );
    }
    Ok(())
}
