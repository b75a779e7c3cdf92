//! Generation as a state machine ([`runtime::generate::Generation`]) on the small llama
//! fixture with the compiled CPU engine: streamed text equals the content, stop strings cut
//! the text (also across tokens, and nothing past them is streamed), a cancel flag stops
//! between tokens, and a prompt the sequence already holds is not evaluated again.

use ir::gguf::GgufFile;
use ir::graph::KvTypes;
use runtime::cpu_engine::{build_plan, CpuEngine, LogitRows};
use runtime::generate::{generate, Completion, GenerateOptions, Generation};
use runtime::sampler::SamplerParams;
use runtime::session::Session;
use runtime::tokenizer::Vocab;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

fn fixture() -> Option<GgufFile> {
    modelc_tests::shared("fixtures/models/llama-sep-Q4_1.gguf")
        .map(|p| GgufFile::open(p).expect("fixture opens"))
}

/// The fixture's vocabulary and a one-sequence session compiled for ubatches 1 and 8.
fn session(gguf: &GgufFile) -> (Vocab, Session<'_>) {
    let model = compiler::load_model(gguf).expect("model lowers");
    let vocab = Vocab::from_gguf(gguf).expect("vocab");
    let plan = build_plan(&model, &[1, 8], 64, KvTypes::F16, LogitRows::Last).expect("plan");
    let engine = CpuEngine::new(gguf, plan, 2).expect("compiles");
    (vocab, Session::single(engine).expect("session"))
}

fn greedy(n: i64) -> GenerateOptions {
    GenerateOptions {
        n_predict: n,
        sampler: SamplerParams {
            temp: 0.0,
            ..SamplerParams::default()
        },
        ..GenerateOptions::default()
    }
}

/// Generates with `opts`, returning the completion and the streamed pieces.
fn run(
    s: &mut Session<'_>,
    vocab: &Vocab,
    prompt: &[u32],
    opts: &GenerateOptions,
) -> (Completion, Vec<String>) {
    let mut pieces = Vec::new();
    let c = generate(s, vocab, prompt, opts, &mut |t| {
        pieces.push(String::from_utf8_lossy(t).into_owned())
    })
    .expect("generates");
    (c, pieces)
}

#[test]
fn streaming_stops_and_cancellation() {
    let Some(gguf) = fixture() else { return };
    let (vocab, mut s) = session(&gguf);
    let prompt = vocab.tokenize("Hello world", true, true);

    // Plain: the streamed pieces are the content.
    let (full, pieces) = run(&mut s, &vocab, &prompt, &greedy(24));
    assert_eq!(full.stop_type, "limit");
    assert_eq!(full.tokens.len(), 24);
    assert_eq!(pieces.concat(), full.content);
    let chars: Vec<(usize, char)> = full.content.char_indices().collect();
    assert!(
        chars.len() > 12,
        "the fixture generates text: {:?}",
        full.content
    );

    // A stop string from the middle of that text (three characters, likely across tokens):
    // the content ends before its first occurrence, and nothing of it is streamed.
    let (a, b) = (chars[6].0, chars[9].0);
    let stop = full.content[a..b].to_string();
    let cut = full.content.find(&stop).expect("occurs");
    let mut opts = greedy(24);
    opts.stop = vec!["never appears".into(), stop.clone()];
    opts.cache_prompt = false;
    let (c, pieces) = run(&mut s, &vocab, &prompt, &opts);
    assert_eq!(c.stop_type, "word");
    assert_eq!(c.stopping_word.as_deref(), Some(stop.as_str()));
    assert_eq!(c.content, full.content[..cut]);
    assert_eq!(pieces.concat(), c.content);
    assert_eq!(c.tokens[..], full.tokens[..c.tokens.len()]);

    // Cancelled from the text callback after the third piece: stops at the next token.
    let flag = Arc::new(AtomicBool::new(false));
    let mut opts = greedy(24);
    opts.cancel = Some(flag.clone());
    let mut n = 0;
    let c = generate(&mut s, &vocab, &prompt, &opts, &mut |_| {
        n += 1;
        if n == 3 {
            flag.store(true, Ordering::Relaxed);
        }
    })
    .expect("generates");
    assert_eq!(c.stop_type, "cancelled");
    assert!(c.tokens.len() < 24, "{} tokens", c.tokens.len());

    // -n 0: nothing generated.
    let (c, pieces) = run(&mut s, &vocab, &prompt, &greedy(0));
    assert!(c.tokens.is_empty() && pieces.is_empty() && c.stop_type == "limit");
}

#[test]
fn held_prompt_is_not_evaluated_again() {
    let Some(gguf) = fixture() else { return };
    let (vocab, mut s) = session(&gguf);
    let prompt = vocab.tokenize("Hello world, and more words here", true, true);

    let mut opts = greedy(6);
    opts.cache_prompt = false;
    let (first, _) = run(&mut s, &vocab, &prompt, &opts);
    assert_eq!(first.timings.cache_n, 0);
    assert_eq!(first.timings.prompt_n, prompt.len());
    // The session holds the prompt and the generated tokens but the last.
    assert_eq!(s.n_past(0), prompt.len() + first.tokens.len() - 1);

    // The same prompt again, without the cache: the same tokens (the same calls).
    let (again, _) = run(&mut s, &vocab, &prompt, &opts);
    assert_eq!(again.tokens, first.tokens);

    // With the cache: only the last prompt token is evaluated (its logits are needed).
    let (cached, _) = run(&mut s, &vocab, &prompt, &greedy(6));
    assert_eq!(cached.timings.cache_n, prompt.len() - 1);
    assert_eq!(cached.timings.prompt_n, 1);

    // A continuation of the conversation: prompt + answer + more keeps all it shares.
    let mut longer = prompt.clone();
    longer.extend_from_slice(&cached.tokens[..cached.tokens.len() - 1]);
    longer.extend(vocab.tokenize(" next", false, true));
    let held = s.n_past(0);
    let mut g = Generation::start(&mut s, &vocab, 0, &longer, &greedy(2)).expect("starts");
    while g.step().expect("step").is_some() {}
    let c = g.finish();
    assert_eq!(c.timings.cache_n, held);
    assert_eq!(c.timings.prompt_n, longer.len() - held);
}
