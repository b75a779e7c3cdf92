//! The Metal engine, macOS only: the program's library compiled from its source when the
//! runner loads it, and run by the shared GPU host side ([`GpuEngine`]) over a
//! [`MetalDevice`].
//!
//! - One library (`newLibraryWithSource:options:error:`) with fast math off, as the CUDA
//!   target compiles without `--use_fast_math`; one compute pipeline per distinct kernel name.
//! - The weights in one buffer, copied from the model file in the `WeightTable` layout.
//!   (`newBufferWithBytesNoCopy:length:options:deallocator:` over the mapped file would
//!   avoid the copy where each weight's start is page-aligned in the file; not done.)
//! - The arena and each sequence's KV memory in buffers of their own. Every buffer is
//!   `MTLStorageModeShared` (Apple GPUs share memory with the CPU): the host writes the
//!   inputs into and reads the logits out of the arena through `contents()`, and zeroes
//!   forgotten KV cells the same way, never while a step runs.
//! - A step is one command buffer with one compute encoder: the three buffers set once,
//!   then per launch its pipeline, its operands (`setBytes` at index 3, the 16 × u64
//!   `Operands` of the prelude) and `dispatchThreadgroups(grid, block)`. The encoder
//!   `computeCommandEncoder` makes is serial (`MTLDispatchTypeSerial`): each dispatch
//!   starts after the previous one ended and sees its writes, so no barrier is encoded.
//!   The host commits and waits for each step (`waitUntilCompleted`) and checks its status.
//!
//! Unverified: this module has never been linked or run. It is built only for macOS, and
//! type-checked from Linux with `cargo clippy -p runtime --target aarch64-apple-darwin`
//! (the rust-std of that target installed) against objc2-metal 0.3.2.

use super::gpu::{Checked, GpuDevice, GpuEngine};
use super::LoadOptions;
use crate::engine::EngineMemory;
use codegen_metal::MetalProgram;
use ir::interp::WeightSource;
use ir::plan::Plan;
use objc2::rc::{autoreleasepool, Retained};
use objc2::runtime::ProtocolObject;
use objc2_foundation::{NSError, NSString};
use objc2_metal::{
    MTLBuffer, MTLCommandBuffer, MTLCommandBufferStatus, MTLCommandEncoder, MTLCommandQueue,
    MTLCompileOptions, MTLComputeCommandEncoder, MTLComputePipelineState,
    MTLCreateSystemDefaultDevice, MTLDevice, MTLLibrary, MTLResourceOptions, MTLSize,
};
use std::collections::BTreeMap;
use std::ops::Range;
use std::ptr::NonNull;

// MTLCreateSystemDefaultDevice finds no device in a process that does not link CoreGraphics
// (objc2-metal's documentation of that function).
#[link(name = "CoreGraphics", kind = "framework")]
extern "C" {}

/// Compiles with fast math off (mathMode safe): the kernels' float arithmetic as written,
/// as the CUDA target compiles without `--use_fast_math`. The property is deprecated from
/// macOS 15 in favour of `mathMode`, which older systems lack; it is still honoured.
#[allow(deprecated)]
fn fast_math_off(options: &MTLCompileOptions) {
    options.setFastMathEnabled(false);
}

type Buffer = Retained<ProtocolObject<dyn MTLBuffer>>;
type Pipeline = Retained<ProtocolObject<dyn MTLComputePipelineState>>;

/// One dispatch of a step.
struct Dispatch {
    /// Index into [`MetalDevice::pipelines`].
    pipeline: usize,
    grid: MTLSize,
    block: MTLSize,
    /// The kernel's `Operands` (buffer 3).
    ops: [u64; codegen_cuda::MAX_OPERANDS],
}

/// The system's default Metal device holding a program (module doc).
pub struct MetalDevice {
    device: Retained<ProtocolObject<dyn MTLDevice>>,
    queue: Retained<ProtocolObject<dyn MTLCommandQueue>>,
    pipelines: Vec<Pipeline>,
    /// Per loaded step (the order of [`Checked::steps`]), its dispatches.
    steps: Vec<Vec<Dispatch>>,
    arena: Buffer,
    arena_bytes: usize,
    wts: Buffer,
    wts_bytes: usize,
    /// Per sequence, its KV memory once opened.
    kv: Vec<Option<Buffer>>,
    kv_bytes: usize,
}

/// An `NSError` as one line.
fn ns_error(what: &str, e: &NSError) -> anyhow::Error {
    let text = e.localizedDescription().to_string();
    let line = text.split_whitespace().collect::<Vec<_>>().join(" ");
    anyhow::anyhow!("Metal: {what}: {line}")
}

/// A zeroed shared buffer of `n` bytes (at least 1).
fn new_buffer(
    device: &ProtocolObject<dyn MTLDevice>,
    n: usize,
    what: &str,
) -> anyhow::Result<Buffer> {
    let max = device.maxBufferLength();
    anyhow::ensure!(
        n <= max,
        "Metal: {what} ({n} bytes) exceed this GPU's largest buffer ({max} bytes)"
    );
    // Metal zeroes a new buffer's contents.
    device
        .newBufferWithLength_options(n.max(1), MTLResourceOptions::StorageModeShared)
        .ok_or_else(|| anyhow::anyhow!("Metal: allocating {what} ({n} bytes) failed"))
}

/// Loads `program` (built from `plan`) with `weights` on the system's default Metal device.
///
/// # Errors
/// What [`super::metal::check`] reports, no Metal device, a source Metal does not compile,
/// a kernel the GPU cannot run with the program's threadgroup size, or what Metal reports;
/// each in one line.
pub fn load(
    plan: &Plan,
    program: &MetalProgram,
    weights: &dyn WeightSource,
    opts: &LoadOptions,
) -> anyhow::Result<GpuEngine<MetalDevice>> {
    let checked = super::metal::check(plan, program, weights, opts)?;
    autoreleasepool(|_| {
        let dev = open(program, &checked)?;
        GpuEngine::new(dev, checked, opts.n_ctx)
    })
}

/// The device with the program's library, pipelines, weights and arena (module doc).
fn open(program: &MetalProgram, checked: &Checked<'_>) -> anyhow::Result<MetalDevice> {
    let device = MTLCreateSystemDefaultDevice().ok_or_else(|| {
        anyhow::anyhow!("--target metal: no Metal device found; compile a CPU runner instead: modelc compile MODEL --target cpu")
    })?;
    let queue = device
        .newCommandQueue()
        .ok_or_else(|| anyhow::anyhow!("Metal: creating a command queue failed"))?;

    let options = MTLCompileOptions::new();
    fast_math_off(&options);
    let source = NSString::from_str(&program.source);
    let library = device
        .newLibraryWithSource_options_error(&source, Some(&*options))
        .map_err(|e| ns_error("compiling the program's source", &e))?;

    let mut pipelines = Vec::new();
    let mut by_name: BTreeMap<&str, usize> = BTreeMap::new();
    let mut steps = Vec::with_capacity(checked.steps.len());
    for s in &checked.steps {
        let table = &program.steps[s.index];
        let mut dispatches = Vec::with_capacity(table.launches.len());
        for l in &table.launches {
            let pipeline = match by_name.get(l.kernel.as_str()) {
                Some(&i) => i,
                None => {
                    let f = library
                        .newFunctionWithName(&NSString::from_str(&l.kernel))
                        .ok_or_else(|| {
                            anyhow::anyhow!(
                                "corrupt Metal program: no kernel {} in its source",
                                l.kernel
                            )
                        })?;
                    let p = device
                        .newComputePipelineStateWithFunction_error(&f)
                        .map_err(|e| ns_error(&format!("kernel {}", l.kernel), &e))?;
                    pipelines.push(p);
                    by_name.insert(&l.kernel, pipelines.len() - 1);
                    pipelines.len() - 1
                }
            };
            let p = &pipelines[pipeline];
            let (max, width) = (p.maxTotalThreadsPerThreadgroup(), p.threadExecutionWidth());
            anyhow::ensure!(
                l.block as usize <= max && width as u32 == codegen_cuda::SIMD_WIDTH,
                "--target metal: kernel {} needs threadgroups of {} threads in SIMD groups of {}; this GPU runs it with at most {max} in SIMD groups of {width}",
                l.kernel,
                l.block,
                codegen_cuda::SIMD_WIDTH
            );
            let size = |x: u32, y: u32, z: u32| MTLSize {
                width: x as usize,
                height: y as usize,
                depth: z as usize,
            };
            dispatches.push(Dispatch {
                pipeline,
                grid: size(l.grid[0], l.grid[1], l.grid[2]),
                block: size(l.block, 1, 1),
                ops: l.operand_array(),
            });
        }
        steps.push(dispatches);
    }

    let wts_bytes = usize::try_from(program.weights.bytes)?;
    let wts = new_buffer(&device, wts_bytes, "the weights")?;
    let base = wts.contents().as_ptr().cast::<u8>();
    for &(off, data) in &checked.weights {
        anyhow::ensure!(
            off.checked_add(data.len()).is_some_and(|e| e <= wts_bytes),
            "corrupt Metal program: a weight outside the weight buffer"
        );
        // SAFETY: `base` is the shared buffer's `wts_bytes` bytes, which nothing else uses
        // yet; `off..off + data.len()` lies inside them (checked above), and the source is
        // the model file's bytes, which do not overlap a new allocation.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), base.add(off), data.len()) };
    }
    let arena_bytes = usize::try_from(program.arena_bytes)?;
    let arena = new_buffer(&device, arena_bytes, "the arena")?;
    Ok(MetalDevice {
        device,
        queue,
        pipelines,
        steps,
        arena,
        arena_bytes,
        wts,
        wts_bytes,
        kv: Vec::new(),
        kv_bytes: usize::try_from(program.kv_bytes)?,
    })
}

impl MetalDevice {
    /// The arena's bytes `at..at + n`, checked to lie inside it.
    fn arena_ptr(&self, at: usize, n: usize) -> anyhow::Result<*mut u8> {
        anyhow::ensure!(
            at.checked_add(n).is_some_and(|e| e <= self.arena_bytes),
            "internal: {n} bytes at {at} outside the arena"
        );
        // SAFETY: an offset inside the buffer's allocation (checked above).
        Ok(unsafe { self.arena.contents().as_ptr().cast::<u8>().add(at) })
    }
}

impl GpuDevice for MetalDevice {
    fn open_stream(&mut self, stream: usize) -> anyhow::Result<()> {
        if self.kv.get(stream).is_some_and(Option::is_some) {
            return Ok(());
        }
        let what = format!("the KV memory of sequence {stream}");
        let kv = new_buffer(&self.device, self.kv_bytes, &what)?;
        if self.kv.len() <= stream {
            self.kv.resize_with(stream + 1, || None);
        }
        self.kv[stream] = Some(kv);
        Ok(())
    }

    fn write_i32(&mut self, at: usize, values: &[i32]) -> anyhow::Result<()> {
        let dst = self.arena_ptr(at, values.len() * 4)?;
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        // SAFETY: `dst` has `bytes.len()` bytes of the shared arena (checked); no step runs
        // (each `run` waits for its command buffer), so the GPU does not access them.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), dst, bytes.len()) };
        Ok(())
    }

    fn run(&mut self, stream: usize, step: usize) -> anyhow::Result<()> {
        let kv = self
            .kv
            .get(stream)
            .and_then(Option::as_ref)
            .ok_or_else(|| anyhow::anyhow!("internal: sequence {stream} has no KV memory"))?;
        let dispatches = self
            .steps
            .get(step)
            .ok_or_else(|| anyhow::anyhow!("internal: no step {step}"))?;
        autoreleasepool(|_| {
            let cmd = self
                .queue
                .commandBuffer()
                .ok_or_else(|| anyhow::anyhow!("Metal: creating a command buffer failed"))?;
            let enc = cmd
                .computeCommandEncoder()
                .ok_or_else(|| anyhow::anyhow!("Metal: creating a compute encoder failed"))?;
            // SAFETY: the kernel ABI's three buffers at indices 0..2, alive until the command
            // buffer completed (this function waits for it); the kernels' offsets were
            // generated for these sizes (program.arena_bytes, kv_bytes, weights.bytes).
            unsafe {
                enc.setBuffer_offset_atIndex(Some(&*self.arena), 0, 0);
                enc.setBuffer_offset_atIndex(Some(&**kv), 0, 1);
                enc.setBuffer_offset_atIndex(Some(&*self.wts), 0, 2);
            }
            for d in dispatches {
                enc.setComputePipelineState(&self.pipelines[d.pipeline]);
                // SAFETY: `ops` is the 128 bytes of the kernels' `constant Operands&` at
                // index 3 (16 × u64, no padding), copied by Metal when encoded.
                unsafe {
                    enc.setBytes_length_atIndex(
                        NonNull::from(&d.ops).cast(),
                        std::mem::size_of_val(&d.ops),
                        3,
                    );
                }
                // The grid and block were checked against the pipeline at load.
                enc.dispatchThreadgroups_threadsPerThreadgroup(d.grid, d.block);
            }
            enc.endEncoding();
            cmd.commit();
            cmd.waitUntilCompleted();
            match cmd.status() {
                MTLCommandBufferStatus::Completed => Ok(()),
                status => Err(match cmd.error() {
                    Some(e) => ns_error("running a step", &e),
                    None => anyhow::anyhow!("Metal: a step ended with status {status:?}"),
                }),
            }
        })
    }

    fn read_f32(&mut self, at: usize, n: usize, out: &mut Vec<f32>) -> anyhow::Result<()> {
        let src = self.arena_ptr(at, n * 4)?;
        // SAFETY: `src` has `n * 4` bytes of the shared arena (checked), written by a step
        // that completed (`run` waits); read as bytes, so alignment does not matter.
        let bytes = unsafe { std::slice::from_raw_parts(src.cast_const(), n * 4) };
        out.extend(
            bytes
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
        );
        Ok(())
    }

    fn zero_kv(&mut self, stream: usize, bytes: Range<u64>) {
        let Some(Some(kv)) = self.kv.get(stream) else {
            return;
        };
        let (start, end) = (bytes.start as usize, bytes.end as usize);
        if start > end || end > self.kv_bytes {
            return;
        }
        // SAFETY: `start..end` lies inside the shared buffer's `kv_bytes` (checked); no step
        // runs while the host calls this (`run` waits for each).
        unsafe {
            let p = kv.contents().as_ptr().cast::<u8>().add(start);
            std::ptr::write_bytes(p, 0, end - start);
        }
    }

    fn memory(&self) -> EngineMemory {
        let kv = self.kv.iter().flatten().count() * self.kv_bytes;
        EngineMemory {
            weights: self.wts_bytes as u64,
            // The device KV memory is the engine's own (the session's has no bytes).
            work: (self.arena_bytes + kv) as u64,
        }
    }
}
