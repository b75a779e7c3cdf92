//! Helpers of the pass tests: logits of a model through the interpreter on its graphs and
//! through the reference executor on a plan, and a tiny llama model made in memory.

#![allow(dead_code)]

use ir::ggml::{f32_to_f16, GgmlType};
use ir::gguf::{GgufFile, GgufWriter, Value};
use ir::interp::{GraphSource, InterpOptions, Outputs, Session, SessionOptions, WeightSource};
use ir::plan::exec::{PlanExec, StepArgs};
use ir::plan::schedule::chunks;
use ir::plan::Plan;

/// Interpreter settings of all pass tests: llama.cpp's roundings, 2 threads.
pub fn opts() -> InterpOptions {
    InterpOptions {
        n_threads: 2,
        ..InterpOptions::rounded()
    }
}

/// Interpreter logits on the graphs of `source`: `prompt` as one ubatch (every row), then,
/// caches cleared, one token at a time.
pub fn graph_logits(
    weights: &dyn WeightSource,
    source: &dyn GraphSource,
    n_ctx: u32,
    prompt: &[u32],
) -> (Vec<f32>, Vec<f32>) {
    let so = SessionOptions {
        n_ctx,
        interp: opts(),
        ..SessionOptions::default()
    };
    let mut s = Session::new(weights, source, so);
    let batch = s.eval(prompt, 0, &Outputs::All).expect("batch eval").values;
    s.clear();
    let mut step = Vec::new();
    for (i, &t) in prompt.iter().enumerate() {
        step.extend(
            s.eval(&[t], i as u32, &Outputs::Last)
                .expect("step eval")
                .values,
        );
    }
    (batch, step)
}

/// Plan logits (a plan compiled with every row's logits): `prompt` cut by the schedule over
/// the plan's ubatch sizes above 1 (so a short prompt runs padded), every real row; then,
/// caches cleared, one token at a time with the 1-token step.
pub fn plan_logits(
    weights: &dyn WeightSource,
    plan: &Plan,
    prompt: &[u32],
) -> (Vec<f32>, Vec<f32>) {
    let mut ex = PlanExec::new(plan, weights, opts()).expect("executor");
    let toks: Vec<i32> = prompt.iter().map(|&t| t as i32).collect();
    let mut batch = Vec::new();
    let sizes: Vec<u32> = plan.ubatch_sizes().into_iter().filter(|&u| u > 1).collect();
    for c in chunks(&sizes, 0, toks.len() as u32, plan.n_ctx).expect("schedule") {
        let t = c.tokens(&toks[c.pos0 as usize..]);
        let p = c.positions();
        let ids: Vec<i32> = (0..c.n_tokens as i32).collect();
        let args = StepArgs {
            tokens: &t,
            positions: &p,
            output_ids: &ids,
            kv_len: c.kv_len(),
        };
        let out = ex.run(c.n_tokens, c.n_tokens, &args).expect("plan step");
        let n_vocab = out[0].len() / c.n_tokens as usize;
        batch.extend_from_slice(&out[0][..n_vocab * c.n_real as usize]);
    }
    ex.interpreter().state_mut().clear();
    let mut step = Vec::new();
    for (i, &t) in toks.iter().enumerate() {
        let args = StepArgs {
            tokens: &[t],
            positions: &[i as i32],
            output_ids: &[0],
            kv_len: i as u64 + 1,
        };
        step.extend(ex.run(1, 1, &args).expect("plan step").remove(0));
    }
    (batch, step)
}

/// Largest absolute difference.
pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// Dimensions of the tiny model.
pub const N_EMBD: u64 = 64;
/// Feed-forward width.
pub const N_FF: u64 = 96;
/// Vocabulary.
pub const N_VOCAB: u64 = 50;

/// A llama model with random weights, made in memory: n_embd 64, 4 heads of 16 with 2 KV
/// heads, n_ff 96, vocabulary 50; matrices in `wtype` (F32 or F16), norms F32; tied output
/// when `tied`.
pub fn tiny_llama(n_layer: u32, tied: bool, wtype: GgmlType) -> GgufFile {
    let mut w = GgufWriter::new();
    let a = "llama";
    w.add_kv("general.architecture", Value::String(a.into()));
    for (k, v) in [
        ("context_length", 64u32),
        ("embedding_length", N_EMBD as u32),
        ("block_count", n_layer),
        ("feed_forward_length", N_FF as u32),
        ("attention.head_count", 4),
        ("attention.head_count_kv", 2),
        ("rope.dimension_count", 16),
        ("vocab_size", N_VOCAB as u32),
    ] {
        w.add_kv(format!("{a}.{k}"), Value::U32(v));
    }
    w.add_kv(
        format!("{a}.attention.layer_norm_rms_epsilon"),
        Value::F32(1e-5),
    );
    let mut seed = 0x2545_f491_u32 ^ n_layer;
    let mut rnd = move |scale: f32| {
        seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
        ((seed >> 8) as f32 / (1u32 << 24) as f32 - 0.5) * 2.0 * scale
    };
    let mut matrix = |w: &mut GgufWriter, name: String, ne: [u64; 2]| {
        let vals: Vec<f32> = (0..ne[0] * ne[1]).map(|_| rnd(0.15)).collect();
        let data: Vec<u8> = match wtype {
            GgmlType::F16 => vals
                .iter()
                .flat_map(|v| f32_to_f16(*v).to_le_bytes())
                .collect(),
            _ => vals.iter().flat_map(|v| v.to_le_bytes()).collect(),
        };
        w.add_tensor(name, &ne, wtype, data).expect("tensor");
    };
    let kv = 32;
    matrix(&mut w, "token_embd.weight".into(), [N_EMBD, N_VOCAB]);
    for il in 0..n_layer {
        for (n, ne) in [
            ("attn_q", [N_EMBD, N_EMBD]),
            ("attn_k", [N_EMBD, kv]),
            ("attn_v", [N_EMBD, kv]),
            ("attn_output", [N_EMBD, N_EMBD]),
            ("ffn_gate", [N_EMBD, N_FF]),
            ("ffn_up", [N_EMBD, N_FF]),
            ("ffn_down", [N_FF, N_EMBD]),
        ] {
            matrix(&mut w, format!("blk.{il}.{n}.weight"), ne);
        }
    }
    if !tied {
        matrix(&mut w, "output.weight".into(), [N_EMBD, N_VOCAB]);
    }
    let mut seed2 = 7u32;
    let mut norm = |w: &mut GgufWriter, name: String| {
        let vals: Vec<f32> = (0..N_EMBD)
            .map(|_| {
                seed2 = seed2.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                1.0 + ((seed2 >> 8) as f32 / (1u32 << 24) as f32 - 0.5) * 0.2
            })
            .collect();
        w.add_tensor(
            name,
            &[N_EMBD],
            GgmlType::F32,
            vals.iter().flat_map(|v| v.to_le_bytes()).collect(),
        )
        .expect("tensor");
    };
    for il in 0..n_layer {
        norm(&mut w, format!("blk.{il}.attn_norm.weight"));
        norm(&mut w, format!("blk.{il}.ffn_norm.weight"));
    }
    norm(&mut w, "output_norm.weight".into());
    GgufFile::from_bytes(w.to_bytes().expect("gguf bytes")).expect("gguf parses")
}

/// A 20-token prompt over the tiny vocabulary.
pub fn tiny_prompt() -> Vec<u32> {
    (0..20u32).map(|i| (i * 7 + 3) % N_VOCAB as u32).collect()
}
