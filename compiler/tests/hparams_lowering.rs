//! Hyperparameters read like llama.cpp's `load_hparams`, and the lowering's checks: on the
//! shared fixtures (values from their README) and on small GGUF files built here.

mod common;

use compiler::{Arch, Error};
use ir::ggml::GgmlType;
use ir::gguf::{GgufFile, GgufWriter, Value};
use ir::graph::{Graph, RopeMode};
use ir::interp::{GraphRequest, InterpOptions, Outputs, Session, SessionOptions};

fn fixture(name: &str) -> Option<GgufFile> {
    let shared = common::shared_dir()?;
    Some(
        GgufFile::open(shared.join(format!("fixtures/models/{name}.gguf"))).expect("fixture opens"),
    )
}

#[test]
fn fixture_hyperparameters_are_read_as_llama_cpp_reads_them() {
    let Some(g) = fixture("llama-sep-F32") else {
        return;
    };
    let hp = compiler::HParams::from_gguf(&g).expect("hparams");
    assert_eq!(
        (
            hp.arch,
            hp.n_embd,
            hp.n_layer,
            hp.n_head,
            hp.n_head_kv,
            hp.n_ff
        ),
        (Arch::Llama, 256, 2, 4, 2, 512)
    );
    assert_eq!(
        (
            hp.n_embd_head_k,
            hp.n_embd_head_v,
            hp.n_rot,
            hp.n_vocab,
            hp.n_ctx_train
        ),
        (64, 64, 64, 1024, 256)
    );
    assert_eq!(
        (
            hp.rope_type,
            hp.rope_freq_base,
            hp.rope_freq_scale,
            hp.f_norm_rms_eps
        ),
        (RopeMode::Norm, 10000.0, 1.0, 1e-5)
    );
    assert!(!hp.tied_output && hp.n_swa == 0);

    let Some(g) = fixture("llama-tied-F32") else {
        return;
    };
    assert!(
        compiler::HParams::from_gguf(&g)
            .expect("hparams")
            .tied_output
    );

    let Some(g) = fixture("qwen2-F32") else {
        return;
    };
    let hp = compiler::HParams::from_gguf(&g).expect("hparams");
    assert_eq!(
        (
            hp.rope_type,
            hp.rope_freq_base,
            hp.f_norm_rms_eps,
            hp.tied_output
        ),
        (RopeMode::Neox, 1e6, 1e-6, true)
    );

    let Some(g) = fixture("gemma3-F32") else {
        return;
    };
    let hp = compiler::HParams::from_gguf(&g).expect("hparams");
    assert_eq!(
        (hp.n_layer, hp.n_swa, hp.swa_layers.clone()),
        (3, 8, vec![true, true, false])
    );
    assert_eq!(
        (
            hp.rope_freq_base,
            hp.rope_freq_base_swa,
            hp.f_attention_scale
        ),
        (1e6, 1e4, Some(0.125))
    );
    assert!(hp.is_swa(0) && hp.is_swa(1) && !hp.is_swa(2));

    let Some(g) = fixture("phi3-F32") else { return };
    let hp = compiler::HParams::from_gguf(&g).expect("hparams");
    assert_eq!(
        (hp.arch, hp.rope_type, hp.tied_output),
        (Arch::Phi3, RopeMode::Neox, false)
    );
}

/// Deterministic values in [-scale, scale).
fn vals(n: usize, seed: u64, scale: f32) -> Vec<f32> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            ((x >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
        })
        .collect()
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

const E: u64 = 32;
const FF: u64 = 64;
const V: u64 = 40;

/// A one-layer llama model with random F32 weights: n_embd 32, 2 heads of 16, 1 KV head,
/// n_ff 64, vocabulary 40. `skip_key` leaves one metadata key out; `bad_q` gives `attn_q` the
/// wrong shape; `skip_tensor` leaves one tensor out.
fn tiny_llama(skip_key: Option<&str>, bad_q: bool, skip_tensor: Option<&str>) -> GgufFile {
    tiny_llama_with(skip_key, bad_q, skip_tensor, None)
}

/// [`tiny_llama`] with a token list of `n_tokens` entries (`tokenizer.ggml.tokens`) beside
/// its `vocab_size` key.
fn tiny_llama_with(
    skip_key: Option<&str>,
    bad_q: bool,
    skip_tensor: Option<&str>,
    n_tokens: Option<usize>,
) -> GgufFile {
    let mut w = GgufWriter::new();
    if let Some(n) = n_tokens {
        let tokens = (0..n).map(|i| format!("t{i}")).collect();
        w.add_kv(
            "tokenizer.ggml.tokens",
            Value::Array(ir::gguf::Array::String(tokens)),
        );
    }
    let kv: Vec<(&str, Value)> = vec![
        ("general.architecture", Value::String("llama".into())),
        ("llama.context_length", Value::U32(64)),
        ("llama.embedding_length", Value::U32(E as u32)),
        ("llama.block_count", Value::U32(1)),
        ("llama.feed_forward_length", Value::U32(FF as u32)),
        ("llama.attention.head_count", Value::U32(2)),
        ("llama.attention.head_count_kv", Value::U32(1)),
        ("llama.attention.layer_norm_rms_epsilon", Value::F32(1e-5)),
        ("llama.vocab_size", Value::U32(V as u32)),
    ];
    for (k, v) in kv {
        if Some(k) != skip_key {
            w.add_kv(k, v);
        }
    }
    let q_rows = if bad_q { E + 1 } else { E };
    let tensors: Vec<(&str, Vec<u64>)> = vec![
        ("token_embd.weight", vec![E, V]),
        ("output_norm.weight", vec![E]),
        ("blk.0.attn_norm.weight", vec![E]),
        ("blk.0.attn_q.weight", vec![E, q_rows]),
        ("blk.0.attn_k.weight", vec![E, 16]),
        ("blk.0.attn_v.weight", vec![E, 16]),
        ("blk.0.attn_output.weight", vec![E, E]),
        ("blk.0.ffn_norm.weight", vec![E]),
        ("blk.0.ffn_gate.weight", vec![E, FF]),
        ("blk.0.ffn_up.weight", vec![E, FF]),
        ("blk.0.ffn_down.weight", vec![FF, E]),
    ];
    for (i, (name, ne)) in tensors.into_iter().enumerate() {
        if Some(name) == skip_tensor {
            continue;
        }
        let n: u64 = ne.iter().product();
        let v = if ne.len() == 1 {
            vals(n as usize, i as u64, 0.1)
                .iter()
                .map(|x| 1.0 + x)
                .collect()
        } else {
            vals(n as usize, i as u64, 0.3)
        };
        w.add_tensor(name, &ne, GgmlType::F32, f32_bytes(&v))
            .expect("tensor");
    }
    GgufFile::from_bytes(w.to_bytes().expect("write")).expect("read back")
}

#[test]
fn errors_name_the_key_or_tensor() {
    match compiler::load_model(&tiny_llama(Some("llama.embedding_length"), false, None)) {
        Err(Error::MissingKey(k)) => assert_eq!(k, "llama.embedding_length"),
        other => panic!("expected a missing key, got {other:?}"),
    }
    match compiler::load_model(&tiny_llama(
        Some("llama.attention.layer_norm_rms_epsilon"),
        false,
        None,
    )) {
        Err(e) => assert!(
            e.to_string()
                .contains("llama.attention.layer_norm_rms_epsilon"),
            "{e}"
        ),
        Ok(_) => panic!("loaded without the rms epsilon"),
    }
    match compiler::load_model(&tiny_llama(None, true, None)) {
        Err(Error::TensorShape {
            name,
            found,
            expected,
        }) => {
            assert_eq!(
                (name.as_str(), found.as_str(), expected.as_str()),
                ("blk.0.attn_q.weight", "{32, 33}", "{32, 32}")
            );
        }
        other => panic!("expected a shape error, got {other:?}"),
    }
    match compiler::load_model(&tiny_llama(None, false, Some("blk.0.ffn_up.weight"))) {
        Err(Error::MissingTensor(n)) => assert_eq!(n, "blk.0.ffn_up.weight"),
        other => panic!("expected a missing tensor, got {other:?}"),
    }
    // A token list shorter than `token_embd` is refused whatever `vocab_size` says, as
    // llama.cpp sizes `token_embd` by the tokenizer (ids past the list have no text).
    match compiler::load_model(&tiny_llama_with(None, false, None, Some(V as usize - 10))) {
        Err(Error::TensorShape { name, .. }) => assert_eq!(name, "token_embd.weight"),
        other => panic!("expected a shape error, got {other:?}"),
    }
    assert!(compiler::load_model(&tiny_llama_with(None, false, None, Some(V as usize))).is_ok());
    // The vocabulary size falls back to the token list, and errors without either.
    match compiler::load_model(&tiny_llama(Some("llama.vocab_size"), false, None)) {
        Err(e) => assert!(e.to_string().contains("llama.vocab_size"), "{e}"),
        Ok(_) => panic!("loaded without a vocabulary size"),
    }
}

#[test]
fn unknown_architectures_are_refused_by_name() {
    let mut w = GgufWriter::new();
    w.add_kv("general.architecture", Value::String("mamba".into()));
    let g = GgufFile::from_bytes(w.to_bytes().expect("write")).expect("read");
    match compiler::load_model(&g) {
        Err(Error::UnsupportedArch(a)) => assert_eq!(a, "mamba"),
        other => panic!("expected an unsupported architecture, got {other:?}"),
    }
}

#[test]
fn lowered_graphs_verify_print_and_round_trip() {
    let g = tiny_llama(None, false, None);
    let model = compiler::load_model(&g).expect("tiny model lowers");
    assert!(model.hparams.tied_output);
    let req = GraphRequest {
        n_tokens: 3,
        n_outputs: 2,
        n_ctx: 16,
        kv_types: ir::graph::KvTypes::F16,
    };
    let graph = model.build_graph(&req).expect("graph");
    graph.verify().expect("verifies");
    let text = graph.to_string();
    assert!(text.contains("result_output = (F32) mul_mat(token_embd.weight {32, 40}, result_norm {32, 2}) = {40, 2}"), "{text}");
    assert!(text.contains("kqv-0 = (F32) attention(Qcur_rope-0 {16, 2, 3}, k-0 {16, 1, kv≤16}, v-0 {16, 1, kv≤16}, inp_pos {3}) = {16, 2, 3}"), "{text}");
    let back = Graph::from_json(&graph.to_json()).expect("round trip");
    assert_eq!(back, graph);
    // A request with more outputs than tokens is refused.
    let bad = GraphRequest {
        n_outputs: 4,
        ..req
    };
    assert!(model.build_graph(&bad).is_err());
}

#[test]
fn logits_do_not_depend_on_the_ubatch_split_with_exact_arithmetic() {
    let g = tiny_llama(None, false, None);
    let model = compiler::load_model(&g).expect("lowers");
    let tokens = [3u32, 17, 5, 39, 0, 21, 8];
    let run = |n_ubatch: u32, one_by_one: bool| -> Vec<f32> {
        let opts = SessionOptions {
            n_ctx: 16,
            n_ubatch,
            interp: InterpOptions::exact(),
            ..SessionOptions::default()
        };
        let mut s = Session::new(&g, &model, opts);
        if one_by_one {
            tokens
                .iter()
                .enumerate()
                .flat_map(|(i, &t)| s.eval(&[t], i as u32, &Outputs::All).expect("eval").values)
                .collect()
        } else {
            s.eval(&tokens, 0, &Outputs::All).expect("eval").values
        }
    };
    let whole = run(64, false);
    assert_eq!(whole.len(), tokens.len() * V as usize);
    assert_eq!(run(3, false), whole);
    assert_eq!(run(64, true), whole);
    // Selected rows are the same rows.
    let mut s = Session::new(
        &g,
        &model,
        SessionOptions {
            n_ctx: 16,
            interp: InterpOptions::exact(),
            ..SessionOptions::default()
        },
    );
    let some = s
        .eval(&tokens, 0, &Outputs::Rows(vec![1, 6]))
        .expect("eval");
    assert_eq!(some.rows, vec![1, 6]);
    assert_eq!(some.row(0), &whole[V as usize..2 * V as usize]);
    assert_eq!(some.row(1), &whole[6 * V as usize..]);
}

#[test]
fn bad_inputs_are_errors_not_panics() {
    let g = tiny_llama(None, false, None);
    let model = compiler::load_model(&g).expect("lowers");
    let mut s = Session::new(
        &g,
        &model,
        SessionOptions {
            n_ctx: 8,
            ..SessionOptions::default()
        },
    );
    let e = s
        .eval(&[40], 0, &Outputs::Last)
        .expect_err("token 40 is outside a 40-token vocabulary");
    assert!(
        e.to_string().contains("token_embd.weight") && e.to_string().contains("40"),
        "{e}"
    );
    assert!(
        s.eval(&[1, 2, 3], 6, &Outputs::Last).is_err(),
        "positions past n_ctx"
    );
    assert!(s.eval(&[], 0, &Outputs::Last).is_err());
    assert!(s.eval(&[1, 2], 0, &Outputs::Rows(vec![1, 0])).is_err());
}
