//! The CUDA backend: the plan's steps as CUDA C (`codegen_cuda::generate`), compiled with
//! NVRTC at `modelc compile` time to CUBINs for sm_80 and sm_90 plus PTX for other GPUs
//! ([`Payload::Cuda`]), and run by [`CudaEngine`]: weights uploaded once, one arena and the
//! KV memory on the device, and per step one CUDA graph of its launches, captured at load and
//! replayed for every ubatch.
//!
//! The engine keeps each sequence's KV memory on the device itself (its
//! [`Engine::kv_layout`] has zero bytes, as the interpreter's does): the kernels read and write
//! it through the `kv` buffer of the kernel ABI ([`codegen_cuda::program`]).
//!
//! Nothing here needs CUDA to build: the driver and NVRTC are loaded at run time (`cudarc`'s
//! dynamic loading); without them every entry point returns a one-line error.

use super::{Backend, LoadOptions, LogitRows, Payload, Support, Target};
use crate::engine::{check_decode_args, Engine, EngineMemory, KvStream};
use anyhow::Context;
use codegen_cuda::nvrtc::{compile_step, step_file_name, NvrtcOptions, DEFAULT_PTX_ARCH};
use codegen_cuda::{GpuProgram, WeightTable, CUDA_PRELUDE};
use cudarc::driver::{
    sys, CudaContext, CudaFunction, CudaGraph, CudaSlice, CudaStream, LaunchConfig, PushKernelArg,
};
use ir::ggml::GgmlType;
use ir::graph::{DType, Input};
use ir::interp::WeightSource;
use ir::plan::{Base, KvLayout, Plan, Step, ValueId};
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// What the CUDA backend compiled for one step: its CUBINs and its PTX.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepBinary {
    /// `(architecture, CUBIN)` pairs (`sm_80`, `sm_90`).
    pub cubins: Vec<Cubin>,
    /// PTX of the step for [`CudaBinaries::ptx_arch`], for GPUs no CUBIN is for.
    pub ptx: String,
}

/// One CUBIN of a step.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cubin {
    /// Its architecture (`sm_90`).
    pub arch: String,
    /// The ELF image (base64 in the artifact).
    #[serde(with = "base64")]
    pub data: Vec<u8>,
}

/// The compiled code of every step of a [`Payload::Cuda`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CudaBinaries {
    /// One per step of the program, in its order.
    pub steps: Vec<StepBinary>,
    /// The virtual architecture of the PTX (`80`: compute_80).
    pub ptx_arch: u32,
}

/// The KV cache pairs the CUDA kernels read: the one place to change when the printer
/// learns more.
pub fn kv_pair_supported(k: DType, v: DType) -> bool {
    matches!(
        (k, v),
        (DType::F16, DType::F16)
            | (DType::F32, DType::F32)
            | (DType::Block(GgmlType::Q8_0), DType::Block(GgmlType::Q8_0))
    )
}

/// The CUDA backend (module doc).
#[derive(Clone, Copy, Debug, Default)]
pub struct CudaBackend;

impl CudaBackend {
    /// The generated program of `plan`, without compiling it.
    ///
    /// # Errors
    /// What the kernel printer reports.
    pub fn generate(&self, plan: &Plan) -> anyhow::Result<GpuProgram> {
        codegen_cuda::generate(plan, CUDA_PRELUDE)
            .map_err(|e| anyhow::anyhow!("--target cuda: {e}"))
    }
}

impl Backend for CudaBackend {
    fn target(&self) -> Target {
        Target::Cuda
    }

    fn supports(&self) -> Support {
        Support {
            weight_types: GgmlType::ALL
                .iter()
                .copied()
                .filter(|&t| ir::ggml::block_format(t).is_some())
                .collect(),
            kv_pairs: Support::kv_pairs_from(kv_pair_supported),
        }
    }

    fn build(&self, plan: Plan) -> anyhow::Result<Payload> {
        self.check(&plan)?;
        let program = self.generate(&plan)?;
        anyhow::ensure!(
            program.steps.len() == plan.steps.len(),
            "--target cuda: the kernel printer made {} step programs for {} steps",
            program.steps.len(),
            plan.steps.len()
        );
        let opts = NvrtcOptions::new().map_err(|e| anyhow::anyhow!("--target cuda: {e}"))?;
        let mut steps = Vec::with_capacity(program.steps.len());
        for s in &program.steps {
            let c = compile_step(s, &opts).map_err(|e| anyhow::anyhow!("--target cuda: {e}"))?;
            // Spills and stack frames are slow local memory: worth a line when they happen.
            for line in c.spills() {
                eprintln!("warning: --target cuda: {}: {line}", step_file_name(s));
            }
            steps.push(StepBinary {
                cubins: c
                    .cubins
                    .into_iter()
                    .map(|(arch, data)| Cubin { arch, data })
                    .collect(),
                ptx: c.ptx,
            });
        }
        Ok(Payload::Cuda {
            plan: Box::new(plan),
            program: Box::new(program),
            binaries: CudaBinaries {
                steps,
                ptx_arch: opts.ptx_arch.unwrap_or(DEFAULT_PTX_ARCH),
            },
        })
    }

    fn sources(&self, plan: &Plan) -> anyhow::Result<Vec<(String, String)>> {
        let program = self.generate(plan)?;
        Ok(program
            .steps
            .iter()
            .map(|s| (step_file_name(s), s.source.clone()))
            .collect())
    }

    fn load<'w>(
        &self,
        payload: &Payload,
        weights: &'w dyn WeightSource,
        opts: &LoadOptions,
    ) -> anyhow::Result<Box<dyn Engine + 'w>> {
        let Payload::Cuda {
            plan,
            program,
            binaries,
        } = payload
        else {
            anyhow::bail!(
                "--target cuda: this program was built for another target ({})",
                payload.kind()
            );
        };
        // cudarc panics where the driver library lacks a function it binds (an old
        // driver): that is an error here, not a crash.
        let loaded = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            CudaEngine::load(plan, program, binaries, weights, opts)
        }))
        .map_err(|_| {
            anyhow::anyhow!("--target cuda: the CUDA driver library failed (too old for CUDA 12?)")
        })??;
        Ok(Box::new(loaded))
    }
}

/// Base64 (RFC 4648, padded) of the CUBINs in the artifact's JSON.
mod base64 {
    use serde::{Deserialize, Deserializer, Serializer};

    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

    /// `bytes` as base64.
    pub fn encode(bytes: &[u8]) -> String {
        let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
        for c in bytes.chunks(3) {
            let n = (u32::from(c[0]) << 16)
                | (u32::from(c.get(1).copied().unwrap_or(0)) << 8)
                | u32::from(c.get(2).copied().unwrap_or(0));
            for i in 0..4 {
                if i <= c.len() {
                    out.push(ALPHABET[(n >> (18 - 6 * i)) as usize & 63] as char);
                } else {
                    out.push('=');
                }
            }
        }
        out
    }

    /// The bytes of base64 text.
    pub fn decode(s: &str) -> Result<Vec<u8>, String> {
        let s = s.as_bytes();
        if !s.len().is_multiple_of(4) {
            return Err("base64 text is not a multiple of 4 characters".into());
        }
        let mut out = Vec::with_capacity(s.len() / 4 * 3);
        for (ci, c) in s.chunks(4).enumerate() {
            let last = ci + 1 == s.len() / 4;
            let mut n = 0u32;
            let mut pad = 0;
            for (i, &ch) in c.iter().enumerate() {
                let v = match ch {
                    b'=' if last && i >= 2 => {
                        pad += 1;
                        0
                    }
                    _ if pad > 0 => return Err("base64 padding in the middle".into()),
                    _ => ALPHABET
                        .iter()
                        .position(|&a| a == ch)
                        .ok_or_else(|| format!("not a base64 character: {:?}", ch as char))?
                        as u32,
                };
                n = (n << 6) | v;
            }
            let b = [(n >> 16) as u8, (n >> 8) as u8, n as u8];
            out.extend_from_slice(&b[..3 - pad]);
        }
        Ok(out)
    }

    pub fn serialize<S: Serializer>(bytes: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&encode(bytes))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let s = String::deserialize(d)?;
        decode(&s).map_err(serde::de::Error::custom)
    }

    #[cfg(test)]
    mod tests {
        #[test]
        fn round_trips() {
            for n in 0..40usize {
                let v: Vec<u8> = (0..n).map(|i| (i * 37 + 11) as u8).collect();
                let e = super::encode(&v);
                assert_eq!(super::decode(&e).as_deref(), Ok(&v[..]), "{n}: {e}");
            }
            assert_eq!(super::encode(b"foobar"), "Zm9vYmFy");
            assert_eq!(super::encode(b"fo"), "Zm8=");
            assert!(super::decode("Zm8").is_err());
            assert!(super::decode("Z=8=").is_err());
        }
    }
}

/// One driver error as a one-line message.
fn drv(what: &str) -> impl FnOnce(cudarc::driver::DriverError) -> anyhow::Error + '_ {
    move |e| anyhow::anyhow!("CUDA: {what}: {e:?}")
}

/// The CUDA driver and one GPU, or a one-line error.
fn open_device() -> anyhow::Result<Arc<CudaContext>> {
    const NONE: &str = "--target cuda: no NVIDIA driver/GPU found";
    // SAFETY: opens (and closes again) libcuda by name, running the initialisers of the
    // driver library the loader finds; NVIDIA's driver library has no preconditions for that.
    if !unsafe { sys::is_culib_present() } {
        anyhow::bail!("{NONE} (libcuda.so is not on the library path); use --target cpu");
    }
    let n = std::panic::catch_unwind(CudaContext::device_count)
        .map_err(|_| anyhow::anyhow!("{NONE} (the driver library failed to load)"))?
        .map_err(|e| anyhow::anyhow!("{NONE} ({e:?}); use --target cpu"))?;
    anyhow::ensure!(
        n > 0,
        "{NONE} (the driver sees no device); use --target cpu"
    );
    CudaContext::new(0).map_err(drv("opening device 0"))
}

/// Where a step reads and writes its inputs and outputs in the arena.
#[derive(Clone, Copy, Debug)]
struct Io {
    /// Byte offset and number of `i32` of the tokens, positions and output ids.
    tokens: (usize, usize),
    positions: (usize, usize),
    output_ids: (usize, usize),
    /// Byte offset and number of `f32` of the logits (`n_outputs × n_vocab`).
    logits: (usize, usize),
}

/// Byte offset in the arena of `id` of `step`, checked to be contiguous `dtype` of `n`
/// elements inside `arena_bytes`.
fn arena_at(
    step: &Step,
    id: ValueId,
    dtype: DType,
    n: usize,
    arena_bytes: u64,
    what: &str,
) -> anyhow::Result<(usize, usize)> {
    let v = step
        .values
        .get(id.index())
        .with_context(|| format!("step n_tokens={}: {what}: no value {}", step.n_tokens, id.0))?;
    let Base::Arena(b) = v.base else {
        anyhow::bail!(
            "step n_tokens={}: {what} is not in the arena",
            step.n_tokens
        );
    };
    let buf_off = step
        .buffers
        .get(b.index())
        .and_then(|b| b.offset)
        .with_context(|| {
            format!(
                "step n_tokens={}: {what}: buffer not planned",
                step.n_tokens
            )
        })?;
    let count: u64 = v.shape.ne.iter().product();
    anyhow::ensure!(
        v.dtype == dtype && v.is_contiguous() && count == n as u64,
        "step n_tokens={}: {what} must be {n} contiguous {} (it is {} of {:?})",
        step.n_tokens,
        dtype.name(),
        v.dtype.name(),
        v.shape.ne
    );
    let start = buf_off
        .checked_add(v.offset)
        .filter(|s| {
            s.checked_add(count * dtype.type_size())
                .is_some_and(|e| e <= arena_bytes)
        })
        .with_context(|| {
            format!(
                "step n_tokens={}: {what} lies outside the arena",
                step.n_tokens
            )
        })?;
    Ok((start as usize, n))
}

/// A kernel's fourth argument: the byte offsets of its operands (`struct Operands { u64
/// at[16]; }` in the prelude), passed by value.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct Operands([u64; codegen_cuda::MAX_OPERANDS]);

// SAFETY: a plain `#[repr(C)]` array of u64, the layout of the kernels' `Operands` struct
// (16 × 8 bytes, 8-byte aligned, no padding).
unsafe impl cudarc::driver::DeviceRepr for Operands {}

/// A step loaded on the device.
struct LoadedStep {
    n_tokens: u32,
    n_outputs: u32,
    io: Io,
    /// The kernels in launch order with their grid and block.
    launches: Vec<(CudaFunction, LaunchConfig, Operands)>,
}

/// One sequence's KV memory on the device and the step graphs over it.
struct DeviceStream {
    kv: CudaSlice<u8>,
    /// One graph per loaded step, in [`CudaEngine::steps`] order.
    graphs: Vec<CudaGraph>,
}

/// A CUDA program loaded on GPU 0 (module doc).
pub struct CudaEngine {
    // Field order is drop order: graphs (in `streams`) before the memory they name, the
    // memory before the stream and the context.
    streams: Vec<Option<DeviceStream>>,
    steps: Vec<LoadedStep>,
    arena: CudaSlice<u8>,
    wts: CudaSlice<u8>,
    stream: Arc<CudaStream>,
    _ctx: Arc<CudaContext>,
    /// Where the caches lie in one device KV memory (the program's `kv_cells`).
    device_kv: KvLayout,
    kv_bytes: usize,
    /// The session's view: no bytes (the KV memory is on the device).
    layout: KvLayout,
    n_vocab: usize,
    n_ctx: usize,
    last_sizes: Vec<u32>,
    all_sizes: Vec<u32>,
    logits: Vec<f32>,
    staging: Vec<u8>,
}

impl CudaEngine {
    /// Loads `program` (built from `plan`, compiled to `binaries`) with `weights` on the
    /// first GPU (module doc).
    ///
    /// # Errors
    /// No driver or GPU, a program that does not match its plan, a context past the
    /// compiled one, a weight the source lacks or holds in another type or shape, a GPU
    /// older than the code, or what the driver reports; each in one line.
    pub fn load(
        plan: &Plan,
        program: &GpuProgram,
        binaries: &CudaBinaries,
        weights: &dyn WeightSource,
        opts: &LoadOptions,
    ) -> anyhow::Result<CudaEngine> {
        anyhow::ensure!(
            opts.n_ctx >= 1 && opts.n_ctx as u64 <= program.kv_cells,
            "-c {}: this program was compiled for a context of at most {} (recompile with modelc compile -c {})",
            opts.n_ctx,
            program.kv_cells,
            opts.n_ctx
        );
        anyhow::ensure!(
            opts.flash_attn,
            "--target cuda: -fa off is not supported (the CUDA kernels compute flash attention)"
        );
        anyhow::ensure!(
            program.steps.len() == plan.steps.len() && binaries.steps.len() == plan.steps.len(),
            "corrupt CUDA program: {} step programs and {} compiled steps for {} plan steps",
            program.steps.len(),
            binaries.steps.len(),
            plan.steps.len()
        );
        let table = WeightTable::new(plan).map_err(anyhow::Error::msg)?;
        anyhow::ensure!(
            table == program.weights,
            "corrupt CUDA program: its weight layout is not the plan's"
        );
        anyhow::ensure!(
            program.kv_cells <= u64::from(plan.n_ctx),
            "corrupt CUDA program: {} KV cells for a plan of n_ctx {}",
            program.kv_cells,
            plan.n_ctx
        );
        let device_kv = plan
            .kv_layout(program.kv_cells)
            .map_err(anyhow::Error::msg)?;
        anyhow::ensure!(
            device_kv.stream_bytes == program.kv_bytes,
            "corrupt CUDA program: {} KV bytes, the plan's layout has {}",
            program.kv_bytes,
            device_kv.stream_bytes
        );
        anyhow::ensure!(
            program.arena_bytes >= plan.arena_bytes(),
            "corrupt CUDA program: an arena of {} bytes for a plan that needs {}",
            program.arena_bytes,
            plan.arena_bytes()
        );
        // The vocabulary: the rows of the first step's logits.
        let n_vocab = plan
            .steps
            .first()
            .and_then(|s| s.values.get(s.outputs.first()?.index()))
            .map(|v| v.shape.ne[0] as usize)
            .filter(|&n| n > 0)
            .context("corrupt CUDA program: the plan's first step has no logits")?;
        let keep = |s: &Step| match opts.logits {
            LogitRows::Both => true,
            LogitRows::Last => s.n_outputs == 1,
            LogitRows::All => s.n_outputs == s.n_tokens,
        };
        // Inputs and outputs of the kept steps, checked before the device is touched.
        let mut ios = Vec::new();
        for (i, s) in plan.steps.iter().enumerate() {
            if !keep(s) {
                continue;
            }
            let p = &program.steps[i];
            anyhow::ensure!(
                p.n_tokens == s.n_tokens && p.n_outputs == s.n_outputs,
                "corrupt CUDA program: step {i} is {}x{}, the plan's is {}x{}",
                p.n_tokens,
                p.n_outputs,
                s.n_tokens,
                s.n_outputs
            );
            for l in &p.launches {
                anyhow::ensure!(
                    l.block > 0
                        && l.block <= 1024
                        && l.block % codegen_cuda::SIMD_WIDTH == 0
                        && l.grid.iter().all(|&g| g > 0)
                        && l.grid[1] <= 65535
                        && l.grid[2] <= 65535,
                    "corrupt CUDA program: launch of {} with grid {:?} and block {}",
                    l.kernel,
                    l.grid,
                    l.block
                );
            }
            if let Some(d) = s.inputs.iter().find(|x| x.kind == Input::Data) {
                anyhow::bail!(
                    "step n_tokens={}: the CUDA engine feeds tokens, positions and output ids only (data input {})",
                    s.n_tokens,
                    s.values.get(d.value.index()).map_or("?", |v| v.name.as_str())
                );
            }
            let input = |kind: Input, n: u32, what: &str| {
                let id = s
                    .input(&kind)
                    .with_context(|| format!("step n_tokens={}: no {what} input", s.n_tokens))?;
                arena_at(s, id, DType::I32, n as usize, program.arena_bytes, what)
            };
            let logits_id = *s
                .outputs
                .first()
                .with_context(|| format!("step n_tokens={}: no outputs", s.n_tokens))?;
            let io = Io {
                tokens: input(Input::Tokens, s.n_tokens, "tokens")?,
                positions: input(Input::Positions, s.n_tokens, "positions")?,
                output_ids: input(Input::OutputIds, s.n_outputs, "output ids")?,
                logits: arena_at(
                    s,
                    logits_id,
                    DType::F32,
                    s.n_outputs as usize * n_vocab,
                    program.arena_bytes,
                    "the logits",
                )?,
            };
            ios.push((i, io));
        }
        anyhow::ensure!(
            !ios.is_empty(),
            "the program has no steps that give {}",
            if opts.logits == LogitRows::All {
                "a logit row per token (recompile it)"
            } else {
                "one logit row per ubatch (recompile it)"
            }
        );
        // Every weight, checked against the plan before anything is allocated.
        let mut sources = Vec::with_capacity(plan.weights.len());
        for (w, &off) in plan.weights.iter().zip(&table.offsets) {
            let r = weights
                .weight(&w.name)
                .with_context(|| format!("the model file has no tensor {}", w.name))?;
            let bytes = w.bytes().context("weight size overflows")?;
            anyhow::ensure!(
                r.ggml_type == w.dtype.ggml_type() && r.data.len() as u64 == bytes,
                "tensor {}: the file holds {} {:?} ({} bytes), the program reads {} {:?} ({} bytes)",
                w.name,
                r.ggml_type.name(),
                r.ne,
                r.data.len(),
                w.dtype.name(),
                w.shape.ne,
                bytes
            );
            sources.push((off as usize, r.data));
        }

        let ctx = open_device()?;
        let (major, minor) = ctx
            .compute_capability()
            .map_err(drv("compute capability"))?;
        // SAFETY: every buffer of this engine is used by the one stream created below only
        // (uploads, launches, copies back), so stream-ordering is all the synchronisation
        // they need; event tracking is switched off before any of them is allocated.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.new_stream().map_err(drv("creating a stream"))?;
        let alloc = |n: u64, what: &str| -> anyhow::Result<CudaSlice<u8>> {
            stream
                .alloc_zeros::<u8>(n.max(1) as usize)
                .map_err(|e| anyhow::anyhow!("CUDA: allocating {what} ({n} bytes): {e:?}"))
        };
        let mut wts = alloc(program.weights.bytes, "the weights")?;
        for (off, data) in &sources {
            let mut dst = wts
                .try_slice_mut(*off..*off + data.len())
                .context("corrupt CUDA program: a weight outside the weight buffer")?;
            stream
                .memcpy_htod(*data, &mut dst)
                .map_err(drv("uploading the weights"))?;
        }
        drop(sources);
        let arena = alloc(program.arena_bytes, "the arena")?;

        let mut steps = Vec::with_capacity(ios.len());
        for (i, io) in ios {
            let (s, bin) = (&program.steps[i], &binaries.steps[i]);
            let image = pick_image(bin, binaries.ptx_arch, (major, minor))?;
            let module = ctx.load_module(image).map_err(drv(&format!(
                "loading the code of step {}",
                step_file_name(s)
            )))?;
            let mut launches = Vec::with_capacity(s.launches.len());
            for l in &s.launches {
                let f = module
                    .load_function(&l.kernel)
                    .map_err(drv(&format!("kernel {}", l.kernel)))?;
                launches.push((
                    f,
                    LaunchConfig {
                        grid_dim: (l.grid[0], l.grid[1], l.grid[2]),
                        block_dim: (l.block, 1, 1),
                        shared_mem_bytes: 0,
                    },
                    Operands(l.operand_array()),
                ));
            }
            steps.push(LoadedStep {
                n_tokens: s.n_tokens,
                n_outputs: s.n_outputs,
                io,
                launches,
            });
        }
        let sizes = |all: bool| -> Vec<u32> {
            let mut v: Vec<u32> = steps
                .iter()
                .filter(|s| {
                    if all {
                        s.n_outputs == s.n_tokens
                    } else {
                        s.n_outputs == 1
                    }
                })
                .map(|s| s.n_tokens)
                .collect();
            v.sort_unstable();
            v.dedup();
            v
        };
        let (last_sizes, all_sizes) = (sizes(false), sizes(true));
        let mut e = CudaEngine {
            streams: Vec::new(),
            steps,
            arena,
            wts,
            stream,
            _ctx: ctx,
            kv_bytes: program.kv_bytes as usize,
            device_kv,
            layout: KvLayout {
                n_cells: opts.n_ctx as u64,
                caches: Vec::new(),
                stream_bytes: 0,
            },
            n_vocab,
            n_ctx: opts.n_ctx,
            last_sizes,
            all_sizes,
            logits: Vec::new(),
            staging: Vec::new(),
        };
        e.open_stream(0)?;
        e.stream.synchronize().map_err(drv("loading"))?;
        Ok(e)
    }

    /// Allocates stream `i`'s KV memory and captures the step graphs over it, once.
    fn open_stream(&mut self, i: usize) -> anyhow::Result<()> {
        if self.streams.get(i).is_some_and(Option::is_some) {
            return Ok(());
        }
        let kv = self
            .stream
            .alloc_zeros::<u8>(self.kv_bytes.max(1))
            .map_err(|e| {
                anyhow::anyhow!(
                    "CUDA: allocating the KV memory of sequence {i} ({} bytes): {e:?}",
                    self.kv_bytes
                )
            })?;
        let mut graphs = Vec::with_capacity(self.steps.len());
        for s in &self.steps {
            graphs.push(self.capture(s, &kv)?);
        }
        if self.streams.len() <= i {
            self.streams.resize_with(i + 1, || None);
        }
        self.streams[i] = Some(DeviceStream { kv, graphs });
        Ok(())
    }

    /// One CUDA graph of `step`'s launches over the arena, `kv` and the weights.
    fn capture(&self, step: &LoadedStep, kv: &CudaSlice<u8>) -> anyhow::Result<CudaGraph> {
        let what = format!("capturing step {}x{}", step.n_tokens, step.n_outputs);
        self.stream
            .begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .map_err(drv(&what))?;
        let mut launched = Ok(());
        for (f, cfg, ops) in &step.launches {
            let mut b = self.stream.launch_builder(f);
            b.arg(&self.arena).arg(kv).arg(&self.wts).arg(ops);
            // SAFETY: every kernel of the ABI takes exactly (u8* arena, u8* kv, const u8*
            // wts, Operands ops), the three device pointers and the operand offsets (a
            // 16 × u64 struct by value, as `Operands` is laid out) pushed above; the graph
            // copies the values at capture. The buffers this engine keeps alive
            // (and never moves) as long as the graph; the offsets the kernels use were
            // generated for buffers of program.arena_bytes, program.kv_bytes and
            // program.weights.bytes, the sizes allocated; the grid and block were checked
            // (block ≤ 1024, a multiple of 32, equal to the kernel's __launch_bounds__ by
            // the printer's contract) and no dynamic shared memory is asked for.
            if let Err(e) = unsafe { b.launch(*cfg) } {
                launched = Err(e);
                break;
            }
        }
        // The capture is always ended, so that the stream is usable after an error.
        let graph = self
            .stream
            .end_capture(sys::CUgraphInstantiate_flags(0))
            .map_err(drv(&what));
        launched.map_err(drv(&what))?;
        let graph = graph?.with_context(|| format!("CUDA: {what}: an empty graph"))?;
        graph.upload().map_err(drv(&what))?;
        Ok(graph)
    }

    /// Writes `values` as `i32` at byte `at` of the arena.
    fn write_i32(&mut self, at: (usize, usize), values: &[i32]) -> anyhow::Result<()> {
        anyhow::ensure!(
            values.len() == at.1,
            "internal: {} inputs for {}",
            values.len(),
            at.1
        );
        self.staging.clear();
        self.staging
            .extend(values.iter().flat_map(|v| v.to_le_bytes()));
        let mut dst = self
            .arena
            .try_slice_mut(at.0..at.0 + self.staging.len())
            .context("internal: an input outside the arena")?;
        self.stream
            .memcpy_htod(&self.staging[..], &mut dst)
            .map_err(drv("writing the inputs"))
    }

    /// Copies the first `rows` logit rows of step `si` to `self.logits`.
    fn read_logits(&mut self, si: usize, rows: usize) -> anyhow::Result<()> {
        let (at, n) = self.steps[si].io.logits;
        let n = (rows * self.n_vocab).min(n);
        self.staging.clear();
        self.staging.resize(n * 4, 0);
        let src = self
            .arena
            .try_slice(at..at + n * 4)
            .context("internal: the logits outside the arena")?;
        self.stream
            .memcpy_dtoh(&src, &mut self.staging[..])
            .map_err(drv("reading the logits"))?;
        self.stream.synchronize().map_err(drv("running the step"))?;
        self.logits.extend(
            self.staging
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
        );
        Ok(())
    }
}

impl Drop for CudaEngine {
    /// Waits for the stream's work before the graphs and buffers it uses are released.
    fn drop(&mut self) {
        let _ = self.stream.synchronize();
    }
}

/// The module image for a GPU of compute capability `cc`: the CUBIN of the same major
/// architecture with the highest minor not above the GPU's, else the PTX.
fn pick_image(
    bin: &StepBinary,
    ptx_arch: u32,
    cc: (i32, i32),
) -> anyhow::Result<cudarc::nvrtc::Ptx> {
    let dev = (cc.0 as u32, cc.1 as u32);
    let best = bin
        .cubins
        .iter()
        .filter_map(|c| {
            let n: u32 = c.arch.strip_prefix("sm_")?.parse().ok()?;
            let (major, minor) = (n / 10, n % 10);
            (major == dev.0 && minor <= dev.1).then_some((minor, c))
        })
        .max_by_key(|&(minor, _)| minor);
    if let Some((_, c)) = best {
        return Ok(cudarc::nvrtc::Ptx::from_binary(c.data.clone()));
    }
    anyhow::ensure!(
        dev.0 * 10 + dev.1 >= ptx_arch && !bin.ptx.is_empty(),
        "--target cuda: this GPU (compute capability {}.{}) is older than the code (compute_{ptx_arch} or later)",
        dev.0,
        dev.1
    );
    Ok(cudarc::nvrtc::Ptx::from_src(bin.ptx.clone()))
}

impl Engine for CudaEngine {
    fn n_vocab(&self) -> usize {
        self.n_vocab
    }

    fn n_ctx(&self) -> usize {
        self.n_ctx
    }

    /// Calls are cut into compiled steps here, as the CPU engine's are.
    fn max_ubatch(&self) -> usize {
        self.last_sizes
            .iter()
            .chain(&self.all_sizes)
            .map(|&s| s as usize)
            .max()
            .unwrap_or(1)
            .max(512)
    }

    fn kv_layout(&self) -> &KvLayout {
        &self.layout
    }

    fn last_logits(&self) -> &[f32] {
        &self.logits
    }

    fn memory(&self) -> EngineMemory {
        let kv: usize = self.streams.iter().flatten().map(|s| s.kv.len()).sum();
        EngineMemory {
            weights: self.wts.len() as u64,
            // The device KV memory is the engine's own (the session's has no bytes).
            work: (self.arena.len() + kv) as u64,
        }
    }

    fn decode(
        &mut self,
        kv: &mut KvStream<'_>,
        tokens: &[u32],
        pos0: usize,
        all_logits: bool,
    ) -> anyhow::Result<&[f32]> {
        check_decode_args(self, tokens, pos0)?;
        let sizes = if all_logits {
            &self.all_sizes
        } else {
            &self.last_sizes
        };
        anyhow::ensure!(
            !sizes.is_empty(),
            "this program was loaded without steps that give {}",
            if all_logits {
                "a logit row per token"
            } else {
                "one logit row per ubatch"
            }
        );
        let cut =
            ir::plan::schedule::chunks(sizes, pos0 as u32, tokens.len() as u32, self.n_ctx as u32)?;
        self.open_stream(kv.index)?;
        self.logits.clear();
        let mut done = 0usize;
        for (ci, c) in cut.iter().enumerate() {
            let n_real = c.n_real as usize;
            let si = self
                .steps
                .iter()
                .position(|s| {
                    s.n_tokens == c.n_tokens
                        && s.n_outputs == if all_logits { c.n_tokens } else { 1 }
                })
                .context("internal: no step for a chunk")?;
            let real: Vec<i32> = tokens[done..done + n_real]
                .iter()
                .map(|&t| t as i32)
                .collect();
            let out_ids: Vec<i32> = if all_logits {
                (0..c.n_tokens as i32).collect()
            } else {
                vec![c.last_row()]
            };
            let io = self.steps[si].io;
            self.write_i32(io.tokens, &c.tokens(&real))?;
            self.write_i32(io.positions, &c.positions())?;
            self.write_i32(io.output_ids, &out_ids)?;
            let graph = self
                .streams
                .get(kv.index)
                .and_then(Option::as_ref)
                .and_then(|s| s.graphs.get(si))
                .context("internal: no graph for the step")?;
            graph.launch().map_err(drv("launching a step"))?;
            // Padding rows are stored too, at the positions after the real ones.
            kv.written = kv.written.max(c.kv_len() as usize);
            if all_logits {
                self.read_logits(si, n_real)?;
            } else if ci + 1 == cut.len() {
                self.read_logits(si, 1)?;
            }
            done += n_real;
        }
        Ok(&self.logits)
    }

    fn forget(&mut self, stream: usize, from: usize) {
        let Some(Some(s)) = self.streams.get_mut(stream) else {
            return;
        };
        for r in self
            .device_kv
            .cell_ranges(from as u64, self.device_kv.n_cells)
        {
            if let Some(mut v) = s.kv.try_slice_mut(r.start as usize..r.end as usize) {
                // A failure here surfaces at the next launch or copy of the stream.
                let _ = self.stream.memset_zeros(&mut v);
            }
        }
    }
}
