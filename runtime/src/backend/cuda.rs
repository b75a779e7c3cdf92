//! The CUDA backend: the plan's steps as CUDA C (`codegen_cuda::generate`), compiled with
//! NVRTC at `modelc compile` time to CUBINs for sm_80 and sm_90 plus PTX for other GPUs
//! ([`Payload::Cuda`]), and run by [`CudaEngine`] (the shared GPU host side,
//! [`super::gpu::GpuEngine`], over a [`CudaDevice`]): weights uploaded once, one arena and the
//! KV memory on the device, and per step one CUDA graph of its launches, captured at load and
//! replayed for every ubatch.
//!
//! The engine keeps each sequence's KV memory on the device itself (its
//! [`Engine::kv_layout`] has zero bytes, as the interpreter's does): the kernels read and write
//! it through the `kv` buffer of the kernel ABI ([`codegen_cuda::program`]).
//!
//! Nothing here needs CUDA to build: the driver and NVRTC are loaded at run time (`cudarc`'s
//! dynamic loading); without them every entry point returns a one-line error.

use super::gpu::{check_program, GpuDevice, GpuEngine, ProgramView, StepView};
use super::{Backend, LoadOptions, Payload, Support, Target};
use crate::engine::{Engine, EngineMemory};
use anyhow::Context;
use codegen_cuda::nvrtc::{compile_step, step_file_name, NvrtcOptions, DEFAULT_PTX_ARCH};
use codegen_cuda::GpuProgram;
use cudarc::driver::{
    sys, CudaContext, CudaFunction, CudaGraph, CudaSlice, CudaStream, LaunchConfig, PushKernelArg,
};
use ir::interp::WeightSource;
use ir::plan::Plan;
use serde::{Deserialize, Serialize};
use std::sync::Arc;

pub use super::gpu::kv_pair_supported;

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

/// The CUDA backend (module doc).
#[derive(Clone, Copy, Debug, Default)]
pub struct CudaBackend {
    /// Generate for full-size sliding-window caches (llama.cpp's `--swa-full`); by default
    /// they are rings of the cells llama.cpp's SWA cache has ([`ir::plan::Plan::kv_layout_ring`]).
    /// The kernels are generated for one layout: a program runs with the `--swa-full` it was
    /// compiled with.
    pub swa_full: bool,
}

impl CudaBackend {
    /// The ubatch the program's KV rings are sized for (`None`: full-size caches).
    fn ring_ubatch(&self, plan: &Plan) -> Option<u32> {
        (!self.swa_full).then(|| plan.ring_ubatch())
    }

    /// The generated program of `plan`, without compiling it.
    ///
    /// # Errors
    /// What the kernel printer reports.
    pub fn generate(&self, plan: &Plan) -> anyhow::Result<GpuProgram> {
        codegen_cuda::generate_with(plan, &codegen_cuda::CUDA, self.ring_ubatch(plan))
            .map_err(|e| anyhow::anyhow!("--target cuda: {e}"))
    }
}

impl<'a> From<&'a codegen_cuda::StepProgram> for StepView<'a> {
    fn from(s: &'a codegen_cuda::StepProgram) -> StepView<'a> {
        StepView {
            n_tokens: s.n_tokens,
            n_outputs: s.n_outputs,
            launches: &s.launches,
        }
    }
}

impl Backend for CudaBackend {
    fn target(&self) -> Target {
        Target::Cuda
    }

    fn supports(&self) -> Support {
        super::gpu::support()
    }

    fn kv_layout(&self, plan: &Plan, opts: &LoadOptions) -> anyhow::Result<ir::plan::KvLayout> {
        super::gpu::kv_layout(plan, opts)
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
    let none = |why: String| super::NoDevice {
        target: super::Target::Cuda,
        what: format!("no NVIDIA driver/GPU found ({why})"),
    };
    // SAFETY: opens (and closes again) libcuda by name, running the initialisers of the
    // driver library the loader finds; NVIDIA's driver library has no preconditions for that.
    if !unsafe { sys::is_culib_present() } {
        return Err(none("libcuda.so is not on the library path".into()).into());
    }
    let n = std::panic::catch_unwind(CudaContext::device_count)
        .map_err(|_| none("the driver library failed to load".into()))?
        .map_err(|e| none(format!("{e:?}")))?;
    if n == 0 {
        return Err(none("the driver sees no device".into()).into());
    }
    CudaContext::new(0).map_err(drv("opening device 0"))
}

/// A kernel's fourth argument: the byte offsets of its operands (`struct Operands { u64
/// at[16]; }` in the prelude), passed by value.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct Operands([u64; codegen_cuda::MAX_OPERANDS]);

// SAFETY: a plain `#[repr(C)]` array of u64, the layout of the kernels' `Operands` struct
// (16 × 8 bytes, 8-byte aligned, no padding).
unsafe impl cudarc::driver::DeviceRepr for Operands {}

/// A step loaded on the device: the kernels in launch order with their grid and block.
struct LoadedStep {
    n_tokens: u32,
    n_outputs: u32,
    launches: Vec<(CudaFunction, LaunchConfig, Operands)>,
}

/// One sequence's KV memory on the device and the step graphs over it.
struct DeviceStream {
    kv: CudaSlice<u8>,
    /// One graph per loaded step, in [`CudaDevice::steps`] order.
    graphs: Vec<CudaGraph>,
}

/// GPU 0 holding a CUDA program: weights, arena, and per sequence its KV memory and one
/// CUDA graph per step (the [`GpuDevice`] of [`CudaEngine`]).
pub struct CudaDevice {
    // Field order is drop order: graphs (in `streams`) before the memory they name, the
    // memory before the stream and the context.
    streams: Vec<Option<DeviceStream>>,
    steps: Vec<LoadedStep>,
    arena: CudaSlice<u8>,
    wts: CudaSlice<u8>,
    stream: Arc<CudaStream>,
    _ctx: Arc<CudaContext>,
    kv_bytes: usize,
    staging: Vec<u8>,
}

/// A CUDA program loaded on GPU 0 (module doc).
pub type CudaEngine = GpuEngine<CudaDevice>;

impl GpuEngine<CudaDevice> {
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
        let views: Vec<StepView<'_>> = program.steps.iter().map(StepView::from).collect();
        let checked = check_program(
            plan,
            &ProgramView {
                target: Target::Cuda,
                steps: &views,
                weights: &program.weights,
                kv_cells: program.kv_cells,
                kv_ring_ubatch: program.kv_ring_ubatch,
                kv_bytes: program.kv_bytes,
                arena_bytes: program.arena_bytes,
            },
            weights,
            opts,
        )?;
        anyhow::ensure!(
            binaries.steps.len() == plan.steps.len(),
            "corrupt CUDA program: {} step programs and {} compiled steps for {} plan steps",
            program.steps.len(),
            binaries.steps.len(),
            plan.steps.len()
        );

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
        for (off, data) in &checked.weights {
            let mut dst = wts
                .try_slice_mut(*off..*off + data.len())
                .context("corrupt CUDA program: a weight outside the weight buffer")?;
            stream
                .memcpy_htod(*data, &mut dst)
                .map_err(drv("uploading the weights"))?;
        }
        let arena = alloc(program.arena_bytes, "the arena")?;

        let mut steps = Vec::with_capacity(checked.steps.len());
        for io in &checked.steps {
            let (s, bin) = (&program.steps[io.index], &binaries.steps[io.index]);
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
                launches,
            });
        }
        let dev = CudaDevice {
            streams: Vec::new(),
            steps,
            arena,
            wts,
            stream,
            _ctx: ctx,
            kv_bytes: program.kv_bytes as usize,
            staging: Vec::new(),
        };
        let e = GpuEngine::new(dev, checked, opts.n_ctx)?;
        e.device().stream.synchronize().map_err(drv("loading"))?;
        Ok(e)
    }
}

impl CudaDevice {
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
}

impl GpuDevice for CudaDevice {
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

    fn write_i32(&mut self, at: usize, values: &[i32]) -> anyhow::Result<()> {
        self.staging.clear();
        self.staging
            .extend(values.iter().flat_map(|v| v.to_le_bytes()));
        let mut dst = self
            .arena
            .try_slice_mut(at..at + self.staging.len())
            .context("internal: an input outside the arena")?;
        self.stream
            .memcpy_htod(&self.staging[..], &mut dst)
            .map_err(drv("writing the inputs"))
    }

    fn run(&mut self, stream: usize, step: usize) -> anyhow::Result<()> {
        let graph = self
            .streams
            .get(stream)
            .and_then(Option::as_ref)
            .and_then(|s| s.graphs.get(step))
            .context("internal: no graph for the step")?;
        graph.launch().map_err(drv("launching a step"))
    }

    fn read_f32(&mut self, at: usize, n: usize, out: &mut Vec<f32>) -> anyhow::Result<()> {
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
        out.extend(
            self.staging
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
        );
        Ok(())
    }

    fn zero_kv(&mut self, stream: usize, bytes: std::ops::Range<u64>) {
        let Some(Some(s)) = self.streams.get_mut(stream) else {
            return;
        };
        if let Some(mut v) = s.kv.try_slice_mut(bytes.start as usize..bytes.end as usize) {
            // A failure here surfaces at the next launch or copy of the stream.
            let _ = self.stream.memset_zeros(&mut v);
        }
    }

    fn memory(&self) -> EngineMemory {
        let kv: usize = self.streams.iter().flatten().map(|s| s.kv.len()).sum();
        EngineMemory {
            weights: self.wts.len() as u64,
            // The device KV memory is the engine's own (the session's has no bytes).
            work: (self.arena.len() + kv) as u64,
        }
    }
}

impl Drop for CudaDevice {
    /// Waits for the stream's work before the graphs and buffers it uses are released.
    fn drop(&mut self) {
        let _ = self.stream.synchronize();
    }
}

/// Where a [`MemoryBandwidth`] figure comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BandwidthSource {
    /// The data sheet's peak for the GPU the driver names ([`hbm_peak_gbs`]).
    DataSheet,
    /// Measured here with device-to-device copies ([`measure_copy_gbs`]).
    Measured,
}

/// The memory bandwidth of GPU 0: what the decode's weight bandwidth is a share of.
#[derive(Clone, Debug, PartialEq)]
pub struct MemoryBandwidth {
    /// The device's name as the driver reports it (`NVIDIA H100 80GB HBM3`).
    pub device: String,
    /// GB/s (10⁹ bytes per second).
    pub gbs: f64,
    /// The data sheet's figure, or a measurement.
    pub source: BandwidthSource,
}

impl std::fmt::Display for MemoryBandwidth {
    /// `NAME: N GB/s (the data sheet's peak)` or `... (measured: device-to-device copy)`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let how = match self.source {
            BandwidthSource::DataSheet => "the data sheet's peak",
            BandwidthSource::Measured => "measured: device-to-device copy, bytes read + written",
        };
        write!(f, "{}: {:.0} GB/s ({how})", self.device, self.gbs)
    }
}

/// The peak memory bandwidth in GB/s of a GPU the driver names `device`, for the GPUs whose
/// figure is certain from the name: an H100 SXM (`NVIDIA H100 80GB HBM3`, `... SXM...`):
/// 3350; an H200 (`NVIDIA H200`, SXM and NVL alike): 4800. `None` for any other (the H100
/// PCIe and NVL have other memory: 2000 and 3900), whose bandwidth is measured instead.
pub fn hbm_peak_gbs(device: &str) -> Option<f64> {
    let d = device.to_ascii_uppercase();
    if d.contains("H200") {
        Some(4800.0)
    } else if d.contains("H100")
        && (d.contains("HBM3") || d.contains("SXM"))
        && !d.contains("PCIE")
        && !d.contains("NVL")
    {
        Some(3350.0)
    } else {
        None
    }
}

/// GPU 0's memory bandwidth: the data sheet's peak where [`hbm_peak_gbs`] knows the name,
/// else [`measure_copy_gbs`].
///
/// # Errors
/// No driver or GPU, or what the driver reports, in one line.
pub fn memory_bandwidth() -> anyhow::Result<MemoryBandwidth> {
    let ctx = open_device()?;
    let device = ctx.name().map_err(drv("reading the device name"))?;
    if let Some(gbs) = hbm_peak_gbs(&device) {
        return Ok(MemoryBandwidth {
            device,
            gbs,
            source: BandwidthSource::DataSheet,
        });
    }
    let gbs = measure_copy_gbs(&ctx)?;
    Ok(MemoryBandwidth {
        device,
        gbs,
        source: BandwidthSource::Measured,
    })
}

/// The bandwidth of device-to-device copies of 1 GiB on `ctx`'s device, in GB/s, counting
/// the bytes read and the bytes written (as the weight bandwidth counts bytes moved): two
/// copies to warm up, then the best of five timed rounds of four copies (CUDA events).
/// Copies reach about 90% of the data sheet's peak on an H100 / H200.
///
/// # Errors
/// Too little free memory for 2 GiB, or what the driver reports.
pub fn measure_copy_gbs(ctx: &Arc<CudaContext>) -> anyhow::Result<f64> {
    const BYTES: usize = 1 << 30;
    const COPIES: usize = 4;
    let stream = ctx.default_stream();
    let src = stream
        .alloc_zeros::<u8>(BYTES)
        .map_err(drv("allocating 1 GiB to measure copies"))?;
    let mut dst = stream
        .alloc_zeros::<u8>(BYTES)
        .map_err(drv("allocating 1 GiB to measure copies"))?;
    for _ in 0..2 {
        stream.memcpy_dtod(&src, &mut dst).map_err(drv("copying"))?;
    }
    let timing = Some(sys::CUevent_flags::CU_EVENT_DEFAULT);
    let mut best_ms = f32::INFINITY;
    for _ in 0..5 {
        let start = stream
            .record_event(timing)
            .map_err(drv("recording an event"))?;
        for _ in 0..COPIES {
            stream.memcpy_dtod(&src, &mut dst).map_err(drv("copying"))?;
        }
        let end = stream
            .record_event(timing)
            .map_err(drv("recording an event"))?;
        best_ms = best_ms.min(start.elapsed_ms(&end).map_err(drv("timing copies"))?);
    }
    anyhow::ensure!(
        best_ms.is_finite() && best_ms > 0.0,
        "CUDA: timing copies: {best_ms} ms"
    );
    Ok((2 * BYTES * COPIES) as f64 / (f64::from(best_ms) * 1e-3) / 1e9)
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

#[cfg(test)]
mod tests {
    use super::hbm_peak_gbs;

    #[test]
    fn data_sheet_bandwidth_by_device_name() {
        // The names nvidia-smi and the driver report on the machines the check runs on.
        assert_eq!(hbm_peak_gbs("NVIDIA H100 80GB HBM3"), Some(3350.0));
        assert_eq!(hbm_peak_gbs("NVIDIA H100 SXM5 80GB"), Some(3350.0));
        assert_eq!(hbm_peak_gbs("NVIDIA H200"), Some(4800.0));
        assert_eq!(hbm_peak_gbs("NVIDIA H200 NVL"), Some(4800.0));
        // Other memory than the SXM's: measured, never the SXM's figure.
        assert_eq!(hbm_peak_gbs("NVIDIA H100 PCIe"), None);
        assert_eq!(hbm_peak_gbs("NVIDIA H100 NVL"), None);
        assert_eq!(hbm_peak_gbs("NVIDIA A100-SXM4-80GB"), None);
        assert_eq!(hbm_peak_gbs(""), None);
    }
}
