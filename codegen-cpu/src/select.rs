//! The `select-kernels` pass: the CPU backend's choice of kernel for every matrix product of
//! a plan, made once, at compile time, for a named CPU ([`CpuTarget`]) and a summation order
//! (`--kernels exact|fast`), and written into the plan, where `--dump-after select-kernels`
//! shows it and the runner reads it. Lowering ([`crate::exec`]) does what the plan says; it
//! chooses nothing.
//!
//! The plan gets a target line, `target {"cpu":…,"arch":…,"tier":…,"kernels":"exact"}`, and
//! every matrix-product kernel a `target={"mul_mat":[…]}` annotation: one [`MatKernel`] per
//! weight, in the kernel's weight order, written `FAMILY@LEVEL` (`rows@avx512vnni`,
//! `repacked@amx`, `generated`). The rules are [`choose`], read top to bottom.

use std::collections::HashSet;

use ir::ggml::{self, GgmlType};
use ir::graph::{Input, Op as IrOp};
use ir::plan::{Base, Kernel, KernelOp, Plan, Step, ValueId};
use serde::{Deserialize, Serialize};

use crate::generated::SumOrder;
use crate::rows::{self, RowDot};
use crate::target::{CpuTarget, Tier};

/// The pass's name, as `--dump-after` and the filetests take it.
pub const PASS_NAME: &str = "select-kernels";

/// Which kind of kernel multiplies one weight.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MatFamily {
    /// A Cranelift kernel generated for the shape, over weights repacked into groups of four
    /// interleaved rows ([`crate::generated`]), in the plan's summation order.
    Generated,
    /// The row-dot routines over the weight read in place, in llama.cpp's `vec_dot` order
    /// (tiled K-quant kernel and tinyBLAS for many columns) (`RowDot::new`).
    Rows,
    /// The row-dot routines in the order of llama.cpp's repacked kernels, for the weights its
    /// x86 build repacks (`ir::ggml::repacked_by_llama_cpp`) (`RowDot::for_weight`).
    Repacked,
    /// The block-order tiles of `--kernels fast` (`RowDot::for_weight_block`).
    Block,
}

impl MatFamily {
    fn name(self) -> &'static str {
        match self {
            MatFamily::Generated => "generated",
            MatFamily::Rows => "rows",
            MatFamily::Repacked => "repacked",
            MatFamily::Block => "block",
        }
    }
}

/// The kernel of one weight's products: a family and, for the hand-written families, the
/// level of the routines it takes ([`Tier`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MatKernel {
    /// The kind of kernel.
    pub family: MatFamily,
    /// The routines' level (the generated kernels ignore it and print none).
    pub tier: Tier,
    /// Whether decode prefetches the weight rows ahead in software (printed `-nopf` when
    /// not; [`CpuTarget::prefetch`]).
    pub prefetch: bool,
}

impl std::fmt::Display for MatKernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.family {
            MatFamily::Generated => f.write_str("generated")?,
            fam => write!(f, "{}@{}", fam.name(), self.tier.name())?,
        }
        if !self.prefetch {
            f.write_str("-nopf")?;
        }
        Ok(())
    }
}

impl std::str::FromStr for MatKernel {
    type Err = String;
    fn from_str(text: &str) -> Result<MatKernel, String> {
        let (s, prefetch) = match text.strip_suffix("-nopf") {
            Some(s) => (s, false),
            None => (text, true),
        };
        let (fam, tier) = s.split_once('@').unwrap_or((s, "plain"));
        let family = [
            MatFamily::Generated,
            MatFamily::Rows,
            MatFamily::Repacked,
            MatFamily::Block,
        ]
        .into_iter()
        .find(|f| f.name() == fam)
        .ok_or_else(|| {
            format!("unknown matmul kernel '{text}' (generated, rows@L, repacked@L, block@L)")
        })?;
        let tier = Tier::from_name(tier).ok_or_else(|| format!("unknown level in '{text}'"))?;
        Ok(MatKernel {
            family,
            tier,
            prefetch,
        })
    }
}

/// What the plan's target line holds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Selection {
    /// The CPU the kernels were chosen for.
    #[serde(flatten)]
    pub cpu: CpuTarget,
    /// The summation order (`exact` or `fast`).
    pub kernels: String,
}

impl Selection {
    /// The summation order the kernels were chosen for.
    ///
    /// # Errors
    /// A name other than `exact` and `fast`.
    pub fn order(&self) -> Result<SumOrder, String> {
        match self.kernels.as_str() {
            "exact" => Ok(SumOrder::Ggml),
            "fast" => Ok(SumOrder::Block),
            k => Err(format!("the plan's kernels are '{k}' (exact or fast)")),
        }
    }
}

/// The name `--kernels` gives `order`.
pub fn order_name(order: SumOrder) -> &'static str {
    match order {
        SumOrder::Ggml => "exact",
        SumOrder::Block => "fast",
    }
}

/// The kernel for the products of a `wtype` weight `ne` (ggml order) with `n_cols`
/// activation columns (`lm_head`: a product whose columns are llama.cpp's `n_outputs`),
/// in `order`, for `cpu` (its level; its prefetch, [`CpuTarget::prefetch`], is every
/// choice's). The family, by these rules in order:
///
/// Exact (`--kernels exact`, llama.cpp's x86 numbers):
/// 1. a weight llama.cpp's x86 build repacks (Q4_0, IQ4_NL, Q4_K, MXFP4 of suitable
///    shapes) takes its repacked kernels' order: `repacked`;
/// 2. a type without a generated kernel (every type but Q4_0, Q4_1, Q8_0, F32, F16, BF16),
///    and the float types (F32, F16, BF16), whose generated kernels add in their own order:
///    `rows`;
/// 3. prompt products (several columns, not the head) of a type whose row-dot routines tile
///    prompts in llama.cpp's order on this level (Q8_0 and the float types with their
///    4 × 4 tiles): `rows`;
/// 4. a type whose row-dot routines have a four-row decode form on this level (Q4_1, Q5_0,
///    Q5_1, Q8_0, Q6_K, F16, ...: measured faster than the generated kernel): `rows`;
/// 5. else `generated`.
///
/// Fast (`--kernels fast`, the block order where a kernel has one):
/// 1. a type with a block-order tile on this level (Q4_1, Q5_0, Q5_1, Q8_0 on AVX-512
///    VNNI; Q4_K's gemv order with AMX): `block`;
/// 2. otherwise as exact rules 2–4 choose row-dot kernels, except that prompts take them
///    only where their packed 8 × 16 tile measured faster than the generated block-order
///    kernel (Q4_0, Q2_K, Q3_K), and decode only for the float types: `repacked` for the
///    weights llama.cpp repacks, else `rows`;
/// 3. else `generated` (in the block order).
///
/// # Errors
/// A type no CPU kernel multiplies.
pub fn choose(
    wtype: GgmlType,
    ne: [u64; 4],
    n_cols: usize,
    lm_head: bool,
    order: SumOrder,
    cpu: &CpuTarget,
) -> Result<MatKernel, String> {
    let tier = cpu.tier;
    let at = |family| {
        Ok(MatKernel {
            family,
            tier,
            prefetch: cpu.prefetch,
        })
    };
    let generated = crate::layout::supports(wtype);
    if !generated && !rows::supports(wtype) {
        return Err(format!("no CPU matmul kernel for {} weights", wtype.name()));
    }
    let prompt = n_cols > 1 && !lm_head;
    let llama_repacks = ggml::repacked_by_llama_cpp(wtype, ne);
    let in_place = if llama_repacks {
        MatFamily::Repacked
    } else {
        MatFamily::Rows
    };
    match order {
        SumOrder::Ggml => {
            if llama_repacks
                || !generated
                || wtype.block_size() == 1
                || prompt && rows::tiles_prompts(wtype, tier)
                || rows::decodes(wtype, tier)
            {
                at(in_place)
            } else {
                at(MatFamily::Generated)
            }
        }
        SumOrder::Block => {
            if RowDot::block_at_level(wtype, tier).is_some() {
                at(MatFamily::Block)
            } else if !generated
                || prompt && rows::packs_prompts(wtype, ne, tier)
                || wtype.block_size() == 1 && rows::decodes(wtype, tier)
            {
                at(in_place)
            } else {
                at(MatFamily::Generated)
            }
        }
    }
}

/// The kernel for the experts of a `mul_mat_id` (a `wtype` weight `{K, M, n_expert}`,
/// `ne`), for `cpu`: the row-dot routines in llama.cpp's order for one expert matrix
/// (`repacked` where its x86 build repacks one, else `rows`), in both summation orders
/// (there is no block-order expert kernel), as llama.cpp's CPU `mul_mat_id` computes them.
///
/// # Errors
/// A type no row-dot kernel multiplies.
pub fn choose_experts(wtype: GgmlType, ne: [u64; 4], cpu: &CpuTarget) -> Result<MatKernel, String> {
    if !rows::supports(wtype) {
        return Err(format!("no CPU kernel for {} experts", wtype.name()));
    }
    let family = if ggml::repacked_by_llama_cpp(wtype, [ne[0], ne[1], 1, 1]) {
        MatFamily::Repacked
    } else {
        MatFamily::Rows
    };
    Ok(MatKernel {
        family,
        tier: cpu.tier,
        prefetch: cpu.prefetch,
    })
}

/// The values of step `s` that hold only the rows that produce logits: those computed from
/// the rows `inp_out_ids` selects (llama.cpp's last layer after
/// `ggml_get_rows(cur, inp_out_ids)`, the output norm, the head).
pub(crate) fn output_rows(s: &Step) -> HashSet<ValueId> {
    let out_ids = s.input(&Input::OutputIds);
    let mut rows = HashSet::new();
    for k in &s.kernels {
        let selects = matches!(k.op, KernelOp::Op(IrOp::GetRows))
            && k.srcs.get(1).is_some_and(|&i| {
                out_ids.is_some_and(|o| s.values[i.index()].same_view(&s.values[o.index()]))
            });
        if selects || k.srcs.iter().any(|v| rows.contains(v)) {
            rows.extend(k.dsts.iter().copied());
        }
    }
    rows
}

/// The input and weights of a matrix-product kernel (`mul_mat_id`'s experts included):
/// `(x, [W_i])` (`None` for other ops).
pub(crate) fn mat_operands(k: &Kernel) -> Option<(ValueId, Vec<ValueId>)> {
    match &k.op {
        KernelOp::MulMat(spec) => {
            let first = 1 + usize::from(spec.norm.is_some());
            let ws = k.srcs.get(first..first + spec.n_mat as usize)?;
            Some((*k.srcs.first()?, ws.to_vec()))
        }
        KernelOp::Op(IrOp::MulMat | IrOp::MulMatId) => {
            Some((*k.srcs.get(1)?, vec![*k.srcs.first()?]))
        }
        _ => None,
    }
}

/// Whether the products of kernel `k` in step `s` are the head's: the output projection,
/// or products of the rows that give logits (their columns are llama.cpp's `n_outputs`).
fn is_lm_head(plan: &Plan, s: &Step, rows: &HashSet<ValueId>, x: ValueId, w: ValueId) -> bool {
    let name = match s.values[w.index()].base {
        Base::Weight(id) => plan.weights[id.index()].name.as_str(),
        _ => "",
    };
    name == "output.weight" || name == "token_embd.weight" || rows.contains(&x)
}

/// Runs the pass: chooses every product's kernel for `cpu` in `order` and writes the
/// choices and the target into `plan` (replacing earlier ones).
///
/// # Errors
/// A weight type no CPU kernel multiplies, naming the weight.
pub fn select_kernels(plan: &mut Plan, cpu: &CpuTarget, order: SumOrder) -> Result<(), String> {
    let mut annotated = Vec::with_capacity(plan.steps.len());
    for s in &plan.steps {
        let rows = output_rows(s);
        let mut per_kernel = Vec::with_capacity(s.kernels.len());
        for k in &s.kernels {
            let Some((x, ws)) = mat_operands(k) else {
                per_kernel.push(None);
                continue;
            };
            let n_cols = s.values[x.index()].shape.ne[1] as usize;
            let mut mats = Vec::with_capacity(ws.len());
            for &w in &ws {
                let v = &s.values[w.index()];
                let t = v.dtype.ggml_type();
                let lm_head = is_lm_head(plan, s, &rows, x, w);
                let m = if matches!(k.op, KernelOp::Op(IrOp::MulMatId)) {
                    choose_experts(t, v.shape.ne, cpu)
                } else {
                    choose(t, v.shape.ne, n_cols, lm_head, order, cpu)
                }
                .map_err(|e| format!("{}: {e}", v.name))?;
                mats.push(serde_json::Value::String(m.to_string()));
            }
            per_kernel.push(Some(serde_json::json!({ "mul_mat": mats })));
        }
        annotated.push(per_kernel);
    }
    for (s, per_kernel) in plan.steps.iter_mut().zip(annotated) {
        for (k, t) in s.kernels.iter_mut().zip(per_kernel) {
            k.target = t;
        }
    }
    let sel = Selection {
        cpu: cpu.clone(),
        kernels: order_name(order).to_string(),
    };
    // Keys in sorted order, so the text is the same whether or not serde_json keeps
    // insertion order (a feature another crate of the build may turn on).
    let sorted: std::collections::BTreeMap<String, serde_json::Value> =
        match serde_json::to_value(&sel).map_err(|e| e.to_string())? {
            serde_json::Value::Object(m) => m.into_iter().collect(),
            _ => return Err("a CPU selection is a JSON object".into()),
        };
    plan.target = Some(serde_json::to_value(sorted).map_err(|e| e.to_string())?);
    Ok(())
}

/// The target line of `plan`, if the pass ran on it.
///
/// # Errors
/// A target annotation that is not the CPU backend's.
pub fn selection(plan: &Plan) -> Result<Option<Selection>, String> {
    plan.target
        .as_ref()
        .map(|t| {
            serde_json::from_value::<Selection>(t.clone())
                .map_err(|e| format!("the plan's target is not a CPU selection: {e}"))
        })
        .transpose()
}

/// The kernels the pass chose for the weights of kernel `k` (in its weight order).
///
/// # Errors
/// No choice recorded (the pass did not run), or one that does not parse.
pub fn mat_kernels(k: &Kernel) -> Result<Vec<MatKernel>, String> {
    let list = k
        .target
        .as_ref()
        .and_then(|t| t.get("mul_mat"))
        .and_then(|m| m.as_array())
        .ok_or_else(|| format!("{}: no kernel chosen (run {PASS_NAME})", k.name))?;
    list.iter()
        .map(|v| {
            v.as_str()
                .ok_or_else(|| format!("{}: a kernel choice is not a string", k.name))?
                .parse()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn choices_print_and_parse_back() {
        for family in [
            MatFamily::Generated,
            MatFamily::Rows,
            MatFamily::Repacked,
            MatFamily::Block,
        ] {
            for tier in Tier::ALL {
                for prefetch in [true, false] {
                    let m = MatKernel {
                        family,
                        tier,
                        prefetch,
                    };
                    let back: MatKernel = m.to_string().parse().unwrap();
                    assert_eq!(back.to_string(), m.to_string());
                    assert_eq!(back.prefetch, prefetch);
                }
            }
        }
        assert!("tiles@avx2".parse::<MatKernel>().is_err());
        assert!("rows@sse9".parse::<MatKernel>().is_err());
    }

    /// The rules on a few cases whose answer the module doc states (they depend on the
    /// level asked for, not on the host).
    #[test]
    fn rules_as_documented() {
        let cpu = |tier| CpuTarget {
            name: "test".into(),
            arch: crate::target::Arch::X86_64,
            tier,
            prefetch: true,
        };
        let q =
            |t, n, order, tier| choose(t, [576, 576, 1, 1], n, false, order, &cpu(tier)).unwrap();
        use MatFamily::{Generated, Repacked, Rows};
        use SumOrder::{Block, Ggml};
        // Plain level: no four-row or tile forms, so the generated kernel for its types.
        assert_eq!(q(GgmlType::Q4_1, 1, Ggml, Tier::Plain).family, Generated);
        assert_eq!(q(GgmlType::Q6_K, 1, Ggml, Tier::Plain).family, Rows);
        assert_eq!(q(GgmlType::F16, 1, Ggml, Tier::Plain).family, Rows);
        // A weight llama.cpp repacks (Q4_0 with rows a multiple of 8).
        assert_eq!(q(GgmlType::Q4_0, 64, Ggml, Tier::Plain).family, Repacked);
        assert_eq!(q(GgmlType::Q4_1, 1, Ggml, Tier::Avx2).family, Rows);
        assert_eq!(q(GgmlType::Q8_0, 64, Ggml, Tier::Avx2).family, Rows);
        let block = q(GgmlType::Q4_1, 64, Block, Tier::Avx512Vnni);
        assert_eq!(block.family, MatFamily::Block);
        assert_eq!(q(GgmlType::Q4_1, 64, Block, Tier::Avx2).family, Generated);
        // The CPU's prefetch is every choice's.
        let zen4 = CpuTarget::named("znver4").unwrap();
        let m = choose(GgmlType::Q8_0, [576, 576, 1, 1], 1, false, Ggml, &zen4).unwrap();
        assert_eq!(m.to_string(), "rows@avx512vbmi-nopf");
        let bad = choose(
            GgmlType::I32,
            [8, 8, 1, 1],
            1,
            false,
            Ggml,
            &cpu(Tier::Plain),
        );
        assert!(bad.is_err());
    }
}
