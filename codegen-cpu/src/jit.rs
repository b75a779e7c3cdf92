//! A small wrapper around Cranelift's JIT: one [`Jit`] builds a module of functions for the
//! host CPU, [`Jit::finalize`] turns it into executable [`JitCode`], which must outlive every
//! function pointer taken from it (kernels hold an `Arc<JitCode>`).
//!
//! The ISA comes from `cranelift_native::builder()`, so AVX, AVX2, FMA, SSE4.1 ... are used when
//! the host has them (the FMA flag is what turns `fma` on `f32x4` into `vfmadd` instead of four
//! libcalls). `opt_level` is `"none"`: on this project's target machine (Zen 3) the kernels are
//! emitted in schedule order and Cranelift's optimizer made them slower (it hoisted every load
//! ahead of the arithmetic and spilled; see issue 5).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use cranelift_codegen::ir::{AbiParam, Function, Signature, Type, UserFuncName};
use cranelift_codegen::isa::{CallConv, OwnedTargetIsa};
use cranelift_codegen::settings::{self, Configurable};
use cranelift_codegen::Context;
use cranelift_jit::{JITBuilder, JITModule};
use cranelift_module::{FuncId, Linkage, Module};

/// Errors of code generation and JIT compilation.
#[derive(Debug, thiserror::Error)]
pub enum CodegenError {
    /// The host CPU is not supported by Cranelift, or lacks a feature the kernels need.
    #[error("host CPU not supported: {0}")]
    Host(String),
    /// A Cranelift setting was rejected (names the setting).
    #[error("cranelift setting {name}={value}: {msg}")]
    Setting {
        /// Setting name.
        name: &'static str,
        /// Value that was rejected.
        value: &'static str,
        /// Cranelift's message.
        msg: String,
    },
    /// Cranelift failed to compile or link a function (names the function).
    #[error("compiling kernel {name}: {msg}")]
    Compile {
        /// Kernel (function) name.
        name: String,
        /// Cranelift's message, including verifier errors.
        msg: String,
    },
    /// A kernel was asked for a weight type this backend does not generate yet.
    #[error("no CPU kernel for weight type {0}")]
    UnsupportedType(&'static str),
    /// A shape that the kernel generator cannot handle (not a multiple of the block size ...).
    #[error("bad shape: {0}")]
    Shape(String),
    /// A quantized weight has an infinite or NaN f16 scale (the kernels' f16 conversion
    /// handles finite values only; see [`crate::layout`]).
    #[error("weight row {row}, block {block}: scale {field} is infinite or NaN")]
    NonFiniteScale {
        /// Row of the weight.
        row: usize,
        /// Block within the row.
        block: usize,
        /// `"d"` or `"m"`.
        field: &'static str,
    },
    /// An F16 weight value is infinite or NaN (the kernels' f16 conversion handles finite
    /// values only).
    #[error("weight row {row}, column {col}: F16 value is infinite or NaN")]
    NonFiniteWeight {
        /// Row of the weight.
        row: usize,
        /// Column (index within the row).
        col: usize,
    },
    /// A buffer given to a kernel or to the repacker has the wrong size.
    #[error("buffer {what}: expected {expected} bytes, got {got}")]
    BufferSize {
        /// Which buffer.
        what: &'static str,
        /// Bytes required.
        expected: usize,
        /// Bytes given.
        got: usize,
    },
}

/// Function-name prefixes of the kernels this crate generates (see [`Jit::define`]).
pub const RESERVED_PREFIXES: &[&str] = &["mul_mat_"];

/// Result type of this crate.
pub type Result<T, E = CodegenError> = std::result::Result<T, E>;

/// Names the host ISA features that matter to the kernels (for reports and bench output).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HostFeatures {
    /// SSSE3 (`pmaddubsw`, `pshufb`).
    pub ssse3: bool,
    /// SSE4.1 (`pmovsx*`, `pminsd`, rounding).
    pub sse41: bool,
    /// AVX (VEX 3-operand encodings).
    pub avx: bool,
    /// AVX2 (register broadcasts).
    pub avx2: bool,
    /// FMA3 (`vfmadd*`).
    pub fma: bool,
    /// aarch64 Advanced SIMD (always present on aarch64 Linux and macOS).
    pub neon: bool,
    /// aarch64 dot product (`sdot`/`udot`, FEAT_DotProd).
    pub dotprod: bool,
    /// aarch64 8-bit integer matrix multiply (`smmla`, FEAT_I8MM).
    pub i8mm: bool,
}

impl HostFeatures {
    /// Detect the features of the running CPU.
    pub fn detect() -> HostFeatures {
        #[cfg(target_arch = "x86_64")]
        {
            HostFeatures {
                ssse3: std::is_x86_feature_detected!("ssse3"),
                sse41: std::is_x86_feature_detected!("sse4.1"),
                avx: std::is_x86_feature_detected!("avx"),
                avx2: std::is_x86_feature_detected!("avx2"),
                fma: std::is_x86_feature_detected!("fma"),
                neon: false,
                dotprod: false,
                i8mm: false,
            }
        }
        #[cfg(target_arch = "aarch64")]
        {
            HostFeatures {
                ssse3: false,
                sse41: false,
                avx: false,
                avx2: false,
                fma: false,
                neon: std::arch::is_aarch64_feature_detected!("neon"),
                dotprod: std::arch::is_aarch64_feature_detected!("dotprod"),
                i8mm: std::arch::is_aarch64_feature_detected!("i8mm"),
            }
        }
        #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
        {
            HostFeatures {
                ssse3: false,
                sse41: false,
                avx: false,
                avx2: false,
                fma: false,
                neon: false,
                dotprod: false,
                i8mm: false,
            }
        }
    }
}

impl std::fmt::Display for HostFeatures {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names = [
            ("ssse3", self.ssse3),
            ("sse4.1", self.sse41),
            ("avx", self.avx),
            ("avx2", self.avx2),
            ("fma", self.fma),
            ("neon", self.neon),
            ("dotprod", self.dotprod),
            ("i8mm", self.i8mm),
        ];
        let on: Vec<&str> = names.iter().filter(|(_, b)| *b).map(|(n, _)| *n).collect();
        f.write_str(&on.join(","))
    }
}

/// Builds a target ISA for the host with the settings the kernels are tuned for.
///
/// Errors: [`CodegenError::Host`] when the host is neither x86-64 with SSSE3 and SSE4.1 (the
/// integer dot-product kernels need `pmaddubsw` and `pmovsx`) nor aarch64 with NEON, or
/// Cranelift rejects it.
pub fn host_isa() -> Result<OwnedTargetIsa> {
    let host = HostFeatures::detect();
    let x86 = cfg!(target_arch = "x86_64") && host.ssse3 && host.sse41;
    let arm = cfg!(target_arch = "aarch64") && host.neon;
    if !x86 && !arm {
        let found = host.to_string();
        let found = if found.is_empty() {
            "none of them"
        } else {
            &found
        };
        return Err(CodegenError::Host(format!(
            "the CPU kernels need x86-64 with SSSE3 and SSE4.1, or aarch64 with NEON (found: {found})"
        )));
    }
    let mut flags = settings::builder();
    let mut set = |name: &'static str, value: &'static str| {
        flags.set(name, value).map_err(|e| CodegenError::Setting {
            name,
            value,
            msg: e.to_string(),
        })
    };
    set("opt_level", "none")?;
    set("is_pic", "false")?;
    set("use_colocated_libcalls", "false")?;
    set(
        "enable_verifier",
        if cfg!(debug_assertions) {
            "true"
        } else {
            "false"
        },
    )?;
    let isa_builder = cranelift_native::builder().map_err(|e| CodegenError::Host(e.to_string()))?;
    isa_builder
        .finish(settings::Flags::new(flags))
        .map_err(|e| CodegenError::Host(e.to_string()))
}

/// The calling convention of Rust's `extern "C"` on this host, as Cranelift names it: the
/// Windows x64 convention on Windows, Apple's AAPCS64 variant on Apple aarch64, and System V
/// (Cranelift's name for both the x86-64 System V psABI and standard AAPCS64) elsewhere.
///
/// This crate calls generated functions through `unsafe extern "C" fn` pointers, so it is
/// what Cranelift must generate: [`Jit::new`] checks that [`Jit::call_conv`] (Cranelift's
/// `default_call_conv` for the host triple) is this convention.
pub fn c_call_conv() -> CallConv {
    if cfg!(windows) {
        CallConv::WindowsFastcall
    } else if cfg!(all(target_arch = "aarch64", target_vendor = "apple")) {
        CallConv::AppleAarch64
    } else {
        CallConv::SystemV
    }
}

/// A module being built: declare and define functions, then [`Jit::finalize`].
pub struct Jit {
    module: JITModule,
    ctx: Context,
    names: HashMap<FuncId, String>,
    /// When set, the disassembly (Cranelift's VCode text) of each compiled function is kept.
    keep_disasm: bool,
    disasm: HashMap<String, String>,
    /// Generate only Cranelift's portable instructions (what aarch64 gets) even on x86-64.
    portable: bool,
}

impl Jit {
    /// A new, empty JIT module for the host CPU.
    ///
    /// Errors: see [`host_isa`]; [`CodegenError::Host`] also when Cranelift's calling
    /// convention for the host is not the one of Rust's `extern "C"` ([`c_call_conv`]),
    /// through which this crate calls the generated functions.
    pub fn new() -> Result<Jit> {
        let isa = host_isa()?;
        let (cranelift, rust) = (isa.default_call_conv(), c_call_conv());
        if cranelift != rust {
            return Err(CodegenError::Host(format!(
                "Cranelift's calling convention for this host is {cranelift}, Rust's extern \"C\" is {rust}"
            )));
        }
        let builder = JITBuilder::with_isa(isa, cranelift_module::default_libcall_names());
        let module = JITModule::new(builder);
        let ctx = module.make_context();
        Ok(Jit {
            module,
            ctx,
            names: HashMap::new(),
            keep_disasm: false,
            disasm: HashMap::new(),
            portable: false,
        })
    }

    /// Keep the disassembly of every function compiled from now on (see [`Jit::disasm`]).
    pub fn keep_disasm(&mut self, on: bool) {
        self.keep_disasm = on;
    }

    /// The disassembly of a compiled function, if [`Jit::keep_disasm`] was on.
    pub fn disasm(&self, name: &str) -> Option<&str> {
        self.disasm.get(name).map(|s| s.as_str())
    }

    /// The calling convention of the host (what generated functions use): Cranelift's
    /// default for the host triple, which [`Jit::new`] checked is [`c_call_conv`], so a
    /// generated function with a signature from [`Jit::signature`] can be called through an
    /// `unsafe extern "C" fn` pointer of the same parameter types.
    pub fn call_conv(&self) -> CallConv {
        self.module.isa().default_call_conv()
    }

    /// Generate only Cranelift's portable instructions from now on, as for aarch64, even
    /// on an x86-64 host: the same numbers, so x86 tests check the forms aarch64 runs.
    pub fn portable(&mut self, on: bool) {
        self.portable = on;
    }

    /// Whether the generators may take x86's own instructions where Cranelift has them
    /// ([`crate::generated`]): the functions are for x86-64 and [`Jit::portable`] is off.
    pub fn is_x86(&self) -> bool {
        self.module.isa().name() == "x64" && !self.portable
    }

    /// The pointer type of the host.
    pub fn pointer_type(&self) -> Type {
        self.module.isa().pointer_type()
    }

    /// The frontend configuration of the host ISA (what `FunctionBuilder::finalize` needs).
    pub fn frontend_config(&self) -> cranelift_codegen::isa::TargetFrontendConfig {
        self.module.isa().frontend_config()
    }

    /// A signature with the host calling convention, these parameter types and no results.
    pub fn signature(&self, params: &[Type]) -> Signature {
        let mut sig = Signature::new(self.call_conv());
        sig.params.extend(params.iter().map(|&t| AbiParam::new(t)));
        sig
    }

    /// Whether a function `name` has been defined in this module.
    pub fn is_defined(&self, name: &str) -> bool {
        self.names.values().any(|n| n == name)
    }

    /// Declares, compiles and defines `func` under `name` (local linkage).
    ///
    /// Names starting with one of [`RESERVED_PREFIXES`] belong to this crate's kernels
    /// (safe wrappers such as `MatmulKernel::from_code` trust their signatures) and are
    /// refused here.
    ///
    /// Errors: [`CodegenError::Compile`] with the verifier's or the backend's message, or for
    /// a reserved name.
    pub fn define(&mut self, name: &str, func: Function) -> Result<FuncId> {
        if RESERVED_PREFIXES.iter().any(|p| name.starts_with(p)) {
            return Err(CodegenError::Compile {
                name: name.to_string(),
                msg: "name reserved for this crate's kernels".to_string(),
            });
        }
        self.define_kernel(name, func)
    }

    /// [`Jit::define`] without the reserved-name check, for this crate's kernel generators.
    pub(crate) fn define_kernel(&mut self, name: &str, mut func: Function) -> Result<FuncId> {
        let err = |msg: String| CodegenError::Compile {
            name: name.to_string(),
            msg,
        };
        let id = self
            .module
            .declare_function(name, Linkage::Local, &func.signature)
            .map_err(|e| err(e.to_string()))?;
        func.name = UserFuncName::user(0, id.as_u32());
        self.ctx.clear();
        self.ctx.func = func;
        self.ctx.set_disasm(self.keep_disasm);
        let res = self.module.define_function(id, &mut self.ctx);
        if let Err(e) = res {
            let msg = match &e {
                cranelift_module::ModuleError::Compilation(
                    cranelift_codegen::CodegenError::Verifier(errs),
                ) => cranelift_codegen::print_errors::pretty_verifier_error(
                    &self.ctx.func,
                    None,
                    errs.clone(),
                ),
                other => other.to_string(),
            };
            self.ctx.clear();
            return Err(err(msg));
        }
        if self.keep_disasm {
            let clif = self.ctx.func.display().to_string();
            if let Some(text) = self.ctx.compiled_code().and_then(|c| c.vcode.clone()) {
                self.disasm
                    .insert(name.to_string(), format!("{clif}\n{text}"));
            }
        }
        self.ctx.clear();
        self.names.insert(id, name.to_string());
        Ok(id)
    }

    /// Links every defined function and makes the code executable.
    ///
    /// Errors: [`CodegenError::Compile`] when relocation or memory protection fails.
    pub fn finalize(mut self) -> Result<Arc<JitCode>> {
        self.module
            .finalize_definitions()
            .map_err(|e| CodegenError::Compile {
                name: "<module>".to_string(),
                msg: e.to_string(),
            })?;
        let mut ptrs = HashMap::new();
        for (&id, name) in &self.names {
            let p = self.module.get_finalized_function(id);
            ptrs.insert(name.clone(), p as usize);
        }
        Ok(Arc::new(JitCode {
            module: Mutex::new(Some(self.module)),
            ptrs,
        }))
    }
}

/// Executable code of a finalized [`Jit`]. The machine code is freed when the last `Arc` to
/// it is dropped, so anything that calls into it must hold one.
pub struct JitCode {
    // Only touched again in `Drop`; the Mutex makes the holder `Sync`.
    module: Mutex<Option<JITModule>>,
    ptrs: HashMap<String, usize>,
}

impl JitCode {
    /// The entry address of the function `name`, if it was defined.
    pub fn address(&self, name: &str) -> Option<usize> {
        self.ptrs.get(name).copied()
    }
}

impl Drop for JitCode {
    fn drop(&mut self) {
        let module = match self.module.get_mut() {
            Ok(m) => m.take(),
            Err(poisoned) => poisoned.into_inner().take(),
        };
        if let Some(module) = module {
            // SAFETY: `JitCode` is only reachable through an `Arc`; this runs when the last
            // holder is gone, and every function pointer handed out is held together with an
            // `Arc<JitCode>`, so no code from this module can run any more.
            unsafe { module.free_memory() };
        }
    }
}

impl std::fmt::Debug for JitCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JitCode")
            .field("functions", &self.ptrs.len())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Generated functions are called through `extern "C"` pointers: Cranelift must
    /// generate that convention (on hosts the JIT supports).
    #[test]
    fn generated_code_uses_the_c_calling_convention() {
        match Jit::new() {
            Ok(jit) => assert_eq!(jit.call_conv(), c_call_conv()),
            Err(CodegenError::Host(msg)) => {
                modelc_tests::skip(&format!("no JIT on this host: {msg}"))
            }
            Err(e) => panic!("{e}"),
        }
        if cfg!(all(target_arch = "x86_64", target_os = "linux")) {
            assert_eq!(c_call_conv(), CallConv::SystemV);
        }
    }
}
