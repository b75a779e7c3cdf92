//! `/infill` prompts ([`runtime::server::api::infill::prompt`]) against llama-server
//! 0c1e570's, on the vocabulary of `../shared/vocab/ggml-vocab-deepseek-coder.gguf` (FIM
//! prefix, suffix and middle tokens; no repo or file-separator token, so extra chunks take
//! the snippet line). The expected prompts are what llama-server printed in its response's
//! `prompt` (the tokens rendered with special tokens) and `tokens_evaluated` for the same
//! request, served from a random-weight model with this vocabulary (`modelc synth
//! --vocab-from`) with `-c 4096 -b 64` (and `--spm-infill` for the last case).

use ir::gguf::GgufFile;
use runtime::server::api::infill::{prompt, Limits};
use runtime::server::params::Body;
use runtime::tokenizer::Vocab;

fn vocab(name: &str) -> Option<Vocab> {
    let path = modelc_tests::require(
        modelc_tests::shared_root().join("vocab").join(name),
        "the shared vocabularies",
    )?;
    let gguf = GgufFile::open(&path).expect("vocabulary opens");
    Some(Vocab::from_gguf(&gguf).expect("vocabulary loads"))
}

const LIMITS: Limits = Limits {
    n_batch: 64,
    n_predict: -1,
    n_ctx: 4096,
    spm: false,
};

/// The prompt of `body` rendered as llama-server renders it, and its length in tokens.
fn rendered(v: &Vocab, body: &serde_json::Value, limits: Limits) -> (String, usize) {
    let body = Body::parse(body.to_string().as_bytes()).expect("body parses");
    let ids = prompt(v, &body, limits).expect("an infill prompt");
    (v.detokenize_lossy(&ids, true), ids.len())
}

#[test]
fn infill_prompts_are_llama_servers() {
    let Some(v) = vocab("ggml-vocab-deepseek-coder.gguf") else {
        return;
    };
    // The prefix keeps its last 3·64/4 tokens, the suffix its first 64/4 − 2 − |prompt|;
    // the extra chunks come first, each after the snippet line.
    let prefix: String = (0..30).map(|i| format!("x{i} = {i}\n")).collect();
    let suffix: String = (0..30).map(|i| format!("y{i} = {i}\n")).collect();
    let body = serde_json::json!({
        "input_prefix": prefix,
        "input_suffix": suffix,
        "input_extra": [{"filename": "a.py", "text": "import os\n"}, {"text": "zzz"}],
        "prompt": "q =",
    });
    assert_eq!(
        rendered(&v, &body, LIMITS),
        (
            "\n\n--- snippet ---\n\nimport os\n\n\n--- snippet ---\n\nzzz<｜begin▁of▁sentence｜>\
             <｜fim▁begin｜>23 = 23\nx24 = 24\nx25 = 25\nx26 = 26\nx27 = 27\nx28 = 28\n\
             x29 = 29\nq =<｜fim▁hole｜>y0 = 0\ny1 = 1\ny2<｜fim▁end｜>"
                .to_string(),
            89
        )
    );
    // Mixed text and token ids; special tokens in the text are not parsed (13 tokens for
    // the literal `<｜fim▁hole｜>`).
    let body = serde_json::json!({
        "input_prefix": ["a", 28, "b<｜fim▁hole｜>"],
        "input_suffix": "c",
    });
    assert_eq!(
        rendered(&v, &body, LIMITS),
        (
            "<｜begin▁of▁sentence｜><｜fim▁begin｜>a=b<｜fim▁hole｜><｜fim▁hole｜>c<｜fim▁end｜>"
                .to_string(),
            21
        )
    );
    // `--spm-infill`: the suffix part first.
    let body = serde_json::json!({
        "input_prefix": "def f():\n    ",
        "input_suffix": "\n    return x\n",
        "prompt": "x =",
    });
    let spm = Limits {
        spm: true,
        ..LIMITS
    };
    assert_eq!(
        rendered(&v, &body, spm),
        (
            "<｜begin▁of▁sentence｜><｜fim▁hole｜>\n    return x\n<｜fim▁begin｜>def f():\n    \
             x =<｜fim▁end｜>"
                .to_string(),
            16
        )
    );
    // The default context with llama-server's -b 2048 leaves no room for extra chunks.
    let body = serde_json::json!({
        "input_prefix": "a",
        "input_suffix": "b",
        "input_extra": [{"text": "never"}],
    });
    let small = Limits {
        n_batch: 2048,
        n_ctx: 1024,
        ..LIMITS
    };
    assert_eq!(
        rendered(&v, &body, small).0,
        "<｜begin▁of▁sentence｜><｜fim▁begin｜>a<｜fim▁hole｜>b<｜fim▁end｜>"
    );
}

#[test]
fn infill_refuses_what_llama_server_refuses() {
    let Some(v) = vocab("ggml-vocab-deepseek-coder.gguf") else {
        return;
    };
    let cases = [
        (
            r#"{"input_suffix": "x"}"#,
            400,
            "\"input_prefix\" is required",
        ),
        (
            r#"{"input_prefix": "x"}"#,
            400,
            "\"input_suffix\" is required",
        ),
        (
            r#"{"input_prefix": "a", "input_suffix": "b", "prompt": 5}"#,
            400,
            "\"prompt\" must be a string",
        ),
        (
            r#"{"input_prefix": "a", "input_suffix": "b", "input_extra": null}"#,
            400,
            "\"input_extra\" must be an array of {\"filename\": string, \"text\": string}",
        ),
        (
            r#"{"input_prefix": "a", "input_suffix": "b", "input_extra": {}}"#,
            400,
            "\"input_extra\" must be an array of {\"filename\": string, \"text\": string}",
        ),
        (
            r#"{"input_prefix": "a", "input_suffix": "b", "input_extra": [{"text": 1}]}"#,
            400,
            "extra_context chunk must contain a \"text\" field with a string value",
        ),
        (
            r#"{"input_prefix": "a", "input_suffix": "b", "input_extra": [{"text": "t", "filename": 2}]}"#,
            400,
            "extra_context chunk's \"filename\" field must be a string",
        ),
    ];
    for (body, code, message) in cases {
        let body = Body::parse(body.as_bytes()).expect("body parses");
        let err = prompt(&v, &body, LIMITS).expect_err(message).object();
        assert_eq!(err["code"], code, "{message}");
        assert_eq!(err["message"], message);
    }
    // A vocabulary without FIM tokens: llama-server's 501, naming each missing token.
    let Some(gpt2) = vocab("ggml-vocab-gpt-2.gguf") else {
        return;
    };
    let body = Body::parse(br#"{"input_prefix": "a", "input_suffix": "b"}"#).expect("parses");
    let err = prompt(&gpt2, &body, LIMITS).expect_err("no FIM").object();
    assert_eq!(err["code"], 501);
    assert_eq!(
        err["message"],
        "Infill is not supported by this model: prefix token is missing. suffix token is \
         missing. middle token is missing. "
    );
}
