//! The compiled artifact and how a runner carries it.
//!
//! `modelc compile` writes a runner by copying the `modelc` executable itself and appending
//! the artifact (JSON) followed by a 16-byte trailer: the artifact's length (u64 LE) and the
//! magic `MODELCRN`. At start-up the executable looks at its own last 16 bytes; when the magic
//! is there it runs as that model's runner. The artifact records its target and the program
//! the target's backend made ([`Payload`]); the runner hands it to that backend. The runner
//! needs only the GGUF file: for the CPU target machine code is regenerated from the stored
//! plan at start-up (Cranelift compiles a kernel in milliseconds), which keeps the runner
//! independent of code addresses and CPU features of the machine that compiled it.

use crate::backend::{Payload, Target};
use anyhow::Context;
use ir::gguf::GgufFile;
use serde::{Deserialize, Serialize};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

/// The magic that ends a runner executable.
pub const RUNNER_MAGIC: &[u8; 8] = b"MODELCRN";
/// Version of the artifact layout; a runner refuses others.
pub const ARTIFACT_VERSION: u32 = 3;

/// What a runner knows about the model it was compiled for.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Artifact {
    /// [`ARTIFACT_VERSION`] of the modelc that wrote it.
    pub version: u32,
    /// modelc's version string.
    pub modelc_version: String,
    /// Absolute path of the GGUF file at compile time (overridable with `-m`).
    pub model_path: PathBuf,
    /// [`fingerprint`] of that file's tensors and hyperparameters: the runner refuses any
    /// other file.
    pub fingerprint: String,
    /// `general.name` of the model, for messages.
    pub model_name: Option<String>,
    /// Compile target (`cpu`, `cuda`, `metal`).
    pub target: Target,
    /// Largest context (`-c` at compile time), the runner's default; its `-c` may ask for
    /// less.
    pub n_ctx: usize,
    /// The ubatch sizes the plan was specialised for, ascending.
    pub ubatch: Vec<usize>,
    /// K cache type the program reads (`f16`, `f32` or `q8_0`).
    pub cache_type_k: String,
    /// V cache type the program reads.
    pub cache_type_v: String,
    /// The CPU kernels `modelc compile --kernels` chose (`exact` or `fast`): the runner's
    /// default for its own `--kernels`. Absent where compile was not told (and in runners
    /// that predate it): `exact`.
    #[serde(default)]
    pub kernels: Option<String>,
    /// What the payload is (`plan`), for tools that read the artifact.
    pub payload_kind: String,
    /// The program the target's backend made.
    pub payload: Payload,
}

/// A 64-bit FNV-1a hash of the tensor table (names, types, shapes, offsets, sizes), the
/// data size, and every metadata entry the compiled program may depend on (all but
/// `general.*` and `tokenizer.*`: the runner reads the tokenizer from the file at start):
/// two files with the same fingerprint hold the same tensors at the same places and the
/// same hyperparameters (a changed `rope.freq_base` or `rms_epsilon` is another model).
pub fn fingerprint(file: &GgufFile) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |bytes: &[u8]| {
        for &b in bytes {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    };
    for t in file.tensors() {
        eat(t.name.as_bytes());
        eat(&t.ggml_type.id().to_le_bytes());
        for d in t.ne {
            eat(&d.to_le_bytes());
        }
        eat(&t.offset.to_le_bytes());
        eat(&t.n_bytes.to_le_bytes());
    }
    eat(&file.tensor_data_bytes().to_le_bytes());
    for (key, value) in file.metadata().iter() {
        if key.starts_with("general.") || key.starts_with("tokenizer.") {
            continue;
        }
        eat(key.as_bytes());
        eat(&(value.value_type() as u32).to_le_bytes());
        // The value's JSON form: its numbers exactly (shortest round-trip), its strings.
        eat(&serde_json::to_vec(value).unwrap_or_default());
    }
    format!("{h:016x}")
}

/// Reads the artifact appended to the executable at `exe`, or `None` for a plain `modelc`.
pub fn read_embedded(exe: &Path) -> anyhow::Result<Option<Artifact>> {
    let mut f = std::fs::File::open(exe).with_context(|| format!("{}", exe.display()))?;
    let len = f.metadata()?.len();
    if len < 16 {
        return Ok(None);
    }
    f.seek(SeekFrom::End(-16))?;
    let mut trailer = [0u8; 16];
    f.read_exact(&mut trailer)?;
    if &trailer[8..] != RUNNER_MAGIC {
        return Ok(None);
    }
    let n = u64::from_le_bytes(trailer[..8].try_into()?);
    anyhow::ensure!(n <= len - 16, "{}: corrupt runner trailer", exe.display());
    f.seek(SeekFrom::Start(len - 16 - n))?;
    let mut json = vec![0u8; n as usize];
    f.read_exact(&mut json)?;
    parse_artifact(&json)
        .with_context(|| format!("{}", exe.display()))
        .map(Some)
}

/// The artifact in `json` (what a runner carries before its trailer): its version first
/// (another version's fields need not parse as this one's), then the rest. The plan in it is
/// verified when a backend loads it, before any code is made from it.
///
/// # Errors
/// Not JSON, another [`ARTIFACT_VERSION`], or fields that do not parse.
pub fn parse_artifact(json: &[u8]) -> anyhow::Result<Artifact> {
    #[derive(Deserialize)]
    struct Version {
        version: u32,
    }
    let v: Version = serde_json::from_slice(json).context("corrupt runner artifact")?;
    anyhow::ensure!(
        v.version == ARTIFACT_VERSION,
        "artifact version {} is not supported by this runner (expected {ARTIFACT_VERSION}); compile the runner again",
        v.version
    );
    serde_json::from_slice(json).context("corrupt runner artifact")
}

/// The bytes of the executable at `exe` without any appended artifact.
fn base_executable(exe: &Path) -> anyhow::Result<Vec<u8>> {
    let mut bytes = std::fs::read(exe).with_context(|| format!("reading {}", exe.display()))?;
    if bytes.len() >= 16 && &bytes[bytes.len() - 8..] == RUNNER_MAGIC {
        let n = u64::from_le_bytes(bytes[bytes.len() - 16..bytes.len() - 8].try_into()?) as usize;
        let keep = bytes
            .len()
            .checked_sub(16 + n)
            .context("corrupt runner trailer")?;
        bytes.truncate(keep);
    }
    Ok(bytes)
}

/// Writes a runner for `artifact` at `out`, atomically (temporary file in the same folder,
/// then rename), executable by its owner and everyone who may read it.
pub fn write_runner(artifact: &Artifact, out: &Path) -> anyhow::Result<()> {
    let exe = std::env::current_exe().context("cannot locate the modelc executable")?;
    let mut bytes = base_executable(&exe)?;
    let json = serde_json::to_vec(artifact)?;
    bytes.extend_from_slice(&json);
    bytes.extend_from_slice(&(json.len() as u64).to_le_bytes());
    bytes.extend_from_slice(RUNNER_MAGIC);
    let (mut f, tmp, dest) = ir::gguf::create_beside(out)
        .map_err(|e| anyhow::anyhow!("writing {}: {e}", out.display()))?;
    let mut write = || -> std::io::Result<()> {
        f.write_all(&bytes)?;
        f.sync_all()?;
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            f.set_permissions(std::fs::Permissions::from_mode(0o755))?;
        }
        std::fs::rename(&tmp, &dest)
    };
    write().map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        anyhow::anyhow!("writing {}: {e}", out.display())
    })
}
