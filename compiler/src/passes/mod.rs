//! The passes that turn a model's graphs into an [`ir::plan::Plan`], as a visible list of
//! named steps ([`pipeline`]); `--dump-after PASS` prints the state after any of them.
//!
//! ```text
//! specialize          one verified graph per compiled ubatch shape (graph source → graphs)
//! kernelize           graphs → plan: one kernel per computing node, views folded into values
//! fuse-rms-norm-mul   rms_norm, mul by the norm weight                  → rms_norm+mul
//! fuse-siblings       mul_mats of one input (q/k/v, gate/up)            → mul_mat×n
//! fuse-norm-mul-mat   rms_norm+mul feeding only mul_mats                → their prologue
//! fuse-glu            mul_mat×2, swiglu/geglu                           → mul_mat×2+swiglu
//! fuse-residual-add   mul_mat, add of its result                        → mul_mat+add
//! fuse-rope-kv-store  rope K, store K (+ rope Q, store V)               → rope+kv_store
//! plan-memory         liveness, in-place reuse, arena offsets, arena size
//! ```
//!
//! [`compile`] runs them all and calls a hook after each: `--dump-after PASS` is
//! `compile(source, &opts, &mut |p, m| if p.name == PASS { print!("{m}") })` ([`Module`]
//! prints the graphs before `kernelize`, the plan after), and [`pass_names`] lists the names
//! it accepts. [`run_pass`] runs one pass by name; [`Module::parse`] reads what a module
//! prints, so a pass can run on text: the filetests in `tests/filetests/` are a module, a
//! pass name and the module expected after it.
//!
//! Attention over the KV cache is one IR op ([`ir::graph::Op::Attention`]) and stays one
//! kernel; no pass splits it. Every pass leaves the plan verified ([`ir::plan::Plan::verify`]
//! runs after each) and computes what the graph computes: the tests run the interpreter on
//! the graph and [`ir::plan::exec`] on the plan after every pass and compare the logits.
//! Passes never reorder the IR ops they fuse, so the results are bit-identical.

mod fuse;
mod kernelize;
mod memory;
mod specialize;

pub use fuse::{
    fuse_glu, fuse_norm_mul_mat, fuse_residual_add, fuse_rms_norm_mul, fuse_rope_kv_store,
    fuse_siblings,
};
pub use kernelize::kernelize;
pub use memory::plan_memory;
pub use specialize::{specialize, StepShape};

use ir::graph::{Graph, KvTypes};
use ir::interp::GraphSource;
use ir::plan::{Plan, PlanError};
use ir::text::ParseError;

/// What went wrong in a pass.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PassError {
    /// Bad compile options.
    #[error("options: {0}")]
    Options(String),
    /// The graph source failed, or gave a graph that cannot be compiled.
    #[error("graph for {n_tokens} tokens: {msg}")]
    Graph {
        /// The ubatch size asked for.
        n_tokens: u32,
        /// What is wrong.
        msg: String,
    },
    /// A pass produced a plan that does not verify (a bug in that pass).
    #[error("after pass {pass}: {err}")]
    Verify {
        /// The pass.
        pass: &'static str,
        /// What the verifier found.
        err: PlanError,
    },
    /// A pass that needs an earlier one's result ran first.
    #[error("pass {0} needs a plan: run kernelize first")]
    Order(&'static str),
}

/// Settings of a compilation.
#[derive(Clone, Debug, PartialEq)]
pub struct CompileOptions {
    /// The ubatch sizes to specialize for (llama.cpp's `n_ubatch` values); default `[1, 64]`.
    pub ubatches: Vec<u32>,
    /// Whether every row of a ubatch produces logits (perplexity, tests) or only one
    /// (generation: the runtime points the one output row at the last real token).
    pub all_logits: bool,
    /// KV cache cells (`n_ctx`).
    pub n_ctx: u32,
    /// KV cache element types (F16 by default, as llama.cpp; F32 and Q8_0 also).
    pub kv_types: KvTypes,
    /// Alignment of arena offsets in bytes.
    pub align: u64,
}

impl Default for CompileOptions {
    fn default() -> CompileOptions {
        CompileOptions {
            ubatches: vec![1, 64],
            all_logits: false,
            n_ctx: 4096,
            kv_types: KvTypes::F16,
            align: ir::plan::DEFAULT_ALIGN,
        }
    }
}

/// What the passes transform: the specialized graphs, then the plan.
///
/// Its text form (`Display`, what `--dump-after` prints) is the plan once there is one,
/// else each graph after a `graph n_tokens=N n_outputs=M` line; [`Module::parse`] reads it
/// back.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Module {
    /// One graph per compiled shape (after `specialize`).
    pub graphs: Vec<(StepShape, Graph)>,
    /// The plan (after `kernelize`).
    pub plan: Option<Plan>,
}

impl std::fmt::Display for Module {
    /// The plan if there is one, else the graphs.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if let Some(p) = &self.plan {
            return write!(f, "{p}");
        }
        for (s, g) in &self.graphs {
            writeln!(f, "graph n_tokens={} n_outputs={}", s.n_tokens, s.n_outputs)?;
            write!(f, "{g}")?;
        }
        Ok(())
    }
}

impl Module {
    /// Reads a module from its text form: a plan ([`ir::plan::parse_plan`]), or graphs each
    /// after a `graph n_tokens=N n_outputs=M` line ([`ir::graph::parse_graph`]); empty text
    /// (or only comments) is the empty module. A printed module with a plan does not show
    /// the graphs it was made from (no later pass reads them), so it reads back with none.
    ///
    /// # Errors
    /// The [`ParseError`] of the first line that does not read, with its line number in
    /// `text`.
    pub fn parse(text: &str) -> Result<Module, ParseError> {
        let lines: Vec<&str> = text.split('\n').collect();
        let significant = |l: &str| {
            let t = l.trim_start();
            !t.is_empty() && !t.starts_with(';')
        };
        let Some(first) = lines.iter().position(|l| significant(l)) else {
            return Ok(Module::default());
        };
        if lines[first].split_whitespace().next() == Some("plan") {
            return Ok(Module {
                graphs: Vec::new(),
                plan: Some(ir::plan::parse_plan(text)?),
            });
        }
        // Graph sections: a header line, then the graph's lines up to the next header.
        let mut headers = Vec::new();
        for (i, l) in lines.iter().enumerate() {
            if let Some(shape) = graph_header(l, i + 1)? {
                headers.push((i, shape));
            }
        }
        if headers.first().map(|h| h.0) != Some(first) {
            let col = lines[first].len() - lines[first].trim_start().len() + 1;
            return Err(ParseError::new(
                first + 1,
                col,
                "expected `graph n_tokens=N n_outputs=M` or `plan …` first",
            ));
        }
        let mut graphs = Vec::with_capacity(headers.len());
        for (k, &(at, shape)) in headers.iter().enumerate() {
            let end = headers.get(k + 1).map_or(lines.len(), |h| h.0);
            let section = lines[at + 1..end].join("\n");
            // Errors count lines from the top of `text`.
            let g = ir::graph::parse_graph(&section).map_err(|mut e| {
                e.line += at + 1;
                e
            })?;
            graphs.push((shape, g));
        }
        Ok(Module { graphs, plan: None })
    }
}

impl std::str::FromStr for Module {
    type Err = ParseError;
    /// [`Module::parse`].
    fn from_str(s: &str) -> Result<Module, ParseError> {
        Module::parse(s)
    }
}

/// The shape of a `graph n_tokens=N n_outputs=M` line (line number `ln`), or `None` when
/// the line is something else.
fn graph_header(line: &str, ln: usize) -> Result<Option<StepShape>, ParseError> {
    let body = line.split(';').next().unwrap_or("");
    let mut words = body.split_whitespace();
    if words.next() != Some("graph")
        || body.trim_start()["graph".len()..]
            .trim_start()
            .starts_with('=')
    {
        return Ok(None);
    }
    let col = |w: &str| line.find(w).map_or(1, |i| line[..i].chars().count() + 1);
    let mut field = |key: &str| -> Result<u32, ParseError> {
        let w = words.next().unwrap_or("");
        w.strip_prefix(key)
            .and_then(|v| v.strip_prefix('='))
            .and_then(|v| v.parse::<u32>().ok())
            .ok_or_else(|| {
                let at = if w.is_empty() {
                    line.chars().count() + 1
                } else {
                    col(w)
                };
                ParseError::new(
                    ln,
                    at,
                    format!("expected `{key}=N` in the graph line, found `{w}`"),
                )
            })
    };
    let shape = StepShape {
        n_tokens: field("n_tokens")?,
        n_outputs: field("n_outputs")?,
    };
    if let Some(w) = words.next() {
        return Err(ParseError::new(
            ln,
            col(w),
            format!("expected the end of the graph line, found `{w}`"),
        ));
    }
    Ok(Some(shape))
}

/// A [`GraphSource`] serving fixed graphs by shape: what `specialize` reads when the graphs
/// come from text (the filetests) rather than from a model.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FixedGraphs(pub Vec<(StepShape, Graph)>);

impl GraphSource for FixedGraphs {
    /// The graph of exactly `req.n_tokens` and `req.n_outputs`.
    fn build_graph(&self, req: &ir::interp::GraphRequest) -> Result<Graph, String> {
        self.0
            .iter()
            .find(|(s, _)| s.n_tokens == req.n_tokens && s.n_outputs == req.n_outputs)
            .map(|(_, g)| g.clone())
            .ok_or_else(|| {
                let have: Vec<String> = self
                    .0
                    .iter()
                    .map(|(s, _)| format!("n_tokens={} n_outputs={}", s.n_tokens, s.n_outputs))
                    .collect();
                format!(
                    "no graph for n_tokens={} n_outputs={} (there are: {})",
                    req.n_tokens,
                    req.n_outputs,
                    if have.is_empty() {
                        "none".to_string()
                    } else {
                        have.join("; ")
                    }
                )
            })
    }
}

/// What a pass sees besides the module.
pub struct PassCtx<'a> {
    /// Where graphs come from (an architecture's lowering).
    pub source: &'a dyn GraphSource,
    /// The settings.
    pub opts: &'a CompileOptions,
}

/// One named pass.
#[derive(Clone, Copy)]
pub struct Pass {
    /// Name, as `--dump-after` takes it.
    pub name: &'static str,
    /// One line on what it does.
    pub about: &'static str,
    /// The transformation.
    pub run: fn(&mut Module, &PassCtx<'_>) -> Result<(), PassError>,
}

impl std::fmt::Debug for Pass {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name)
    }
}

fn plan_mut<'m>(m: &'m mut Module, pass: &'static str) -> Result<&'m mut Plan, PassError> {
    m.plan.as_mut().ok_or(PassError::Order(pass))
}

/// A pass that rewrites each step of the plan with `f`.
macro_rules! step_pass {
    ($name:literal, $about:literal, $f:path) => {
        Pass {
            name: $name,
            about: $about,
            run: |m, _| {
                let plan = plan_mut(m, $name)?;
                let kv = plan.kv.clone();
                for s in &mut plan.steps {
                    $f(s, &kv);
                }
                Ok(())
            },
        }
    };
}

/// The passes, in the order [`compile`] runs them.
pub fn pipeline() -> Vec<Pass> {
    vec![
        Pass {
            name: "specialize",
            about: "one verified graph per compiled ubatch shape",
            run: |m, cx| {
                m.graphs = specialize(cx.source, cx.opts)?;
                m.plan = None;
                Ok(())
            },
        },
        Pass {
            name: "kernelize",
            about: "graphs to a plan: one kernel per computing node, views folded into values",
            run: |m, cx| {
                m.plan = Some(kernelize(&m.graphs, cx.opts)?);
                Ok(())
            },
        },
        step_pass!(
            "fuse-rms-norm-mul",
            "rms_norm then mul by a weight vector: one kernel",
            fuse_rms_norm_mul
        ),
        step_pass!(
            "fuse-siblings",
            "mul_mats of one input (q/k/v, gate/up): one kernel",
            fuse_siblings
        ),
        step_pass!(
            "fuse-norm-mul-mat",
            "rms_norm+mul into the mul_mats it feeds",
            fuse_norm_mul_mat
        ),
        step_pass!(
            "fuse-glu",
            "swiglu/geglu into the gate/up mul_mat",
            fuse_glu
        ),
        step_pass!(
            "fuse-residual-add",
            "add of a mul_mat's result into the mul_mat",
            fuse_residual_add
        ),
        step_pass!(
            "fuse-rope-kv-store",
            "rope of K into its KV store, with rope of Q and store of V",
            fuse_rope_kv_store
        ),
        Pass {
            name: "plan-memory",
            about: "liveness, in-place reuse, arena offsets and size",
            run: |m, _| {
                let plan = plan_mut(m, "plan-memory")?;
                let align = plan.align;
                for s in &mut plan.steps {
                    plan_memory(s, align);
                }
                Ok(())
            },
        },
    ]
}

/// The names of the passes, in order.
pub fn pass_names() -> Vec<&'static str> {
    pipeline().iter().map(|p| p.name).collect()
}

/// Runs `pass` on `m` and verifies the plan after it, if there is one.
fn run_verified(pass: &Pass, m: &mut Module, cx: &PassCtx<'_>) -> Result<(), PassError> {
    (pass.run)(m, cx)?;
    if let Some(p) = &m.plan {
        p.verify().map_err(|err| PassError::Verify {
            pass: pass.name,
            err,
        })?;
    }
    Ok(())
}

/// Runs the one pass named `name` on `m` (as [`compile`] runs it: the plan is verified
/// after it). With [`Module::parse`] and [`FixedGraphs`] this runs any pass on a module read
/// from text, as the filetests do.
///
/// # Errors
/// [`PassError::Options`] for a name that is not in the [`pipeline`] (listing the names);
/// what the pass reports; [`PassError::Verify`] if it leaves a plan that does not verify.
pub fn run_pass(name: &str, m: &mut Module, cx: &PassCtx<'_>) -> Result<(), PassError> {
    let Some(pass) = pipeline().into_iter().find(|p| p.name == name) else {
        return Err(PassError::Options(format!(
            "no pass named '{name}' (passes: {})",
            pass_names().join(", ")
        )));
    };
    run_verified(&pass, m, cx)
}

/// Runs the whole [`pipeline`] on the graphs of `source`, verifying the plan after every
/// pass and calling `after(pass, module)` after each (for `--dump-after`, progress, tests).
///
/// # Errors
/// Whatever a pass reports; [`PassError::Verify`] if a pass leaves a plan that does not
/// verify.
pub fn compile(
    source: &dyn GraphSource,
    opts: &CompileOptions,
    after: &mut dyn FnMut(&Pass, &Module),
) -> Result<Plan, PassError> {
    let cx = PassCtx { source, opts };
    let mut m = Module::default();
    for pass in pipeline() {
        run_verified(&pass, &mut m, &cx)?;
        after(&pass, &m);
    }
    m.plan.ok_or(PassError::Order("compile"))
}
