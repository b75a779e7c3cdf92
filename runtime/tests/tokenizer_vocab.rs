//! The llama.cpp tokenizer suites in `../shared/vocab/`: every input must give exactly the ids
//! llama.cpp gave (`add_special = false`, `parse_special = false`), and detokenizing them must
//! give back the input where llama.cpp's own test expects it.

use ir::gguf::GgufFile;
use runtime::tokenizer::Vocab;
use std::path::Path;

/// Inputs of a `.inp` file (separator "\n__ggml_vocab_test__\n"; the last input runs to the end).
fn read_inputs(path: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    text.split("\n__ggml_vocab_test__\n")
        .map(str::to_string)
        .collect()
}

fn read_expected(path: &Path) -> Vec<Vec<u32>> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    text.lines()
        .map(|l| {
            l.split_whitespace()
                .map(|t| {
                    t.parse()
                        .unwrap_or_else(|e| panic!("{}: '{t}': {e}", path.display()))
                })
                .collect()
        })
        .collect()
}

/// Runs one suite of `../shared/vocab/`; returns (cases, mismatching cases).
fn run_suite(name: &str) -> Option<(usize, usize)> {
    let dir = modelc_tests::shared("vocab")?;
    run_suite_at(&dir.join(format!("ggml-vocab-{name}.gguf")))
}

/// Runs the suite of the vocabulary file `gguf` (its `.inp` / `.out` beside it).
fn run_suite_at(gguf: &Path) -> Option<(usize, usize)> {
    let name = gguf.file_name()?.to_string_lossy().into_owned();
    let file = GgufFile::open(gguf).unwrap_or_else(|e| panic!("{e}"));
    let vocab = Vocab::from_gguf(&file).unwrap_or_else(|e| panic!("{name}: {e}"));
    let mut inputs = read_inputs(&gguf.with_extension("gguf.inp"));
    let expected = read_expected(&gguf.with_extension("gguf.out"));
    // The writer ends every input with the separator, so the piece after the last one is
    // empty and has no line in `.out`.
    if inputs.len() == expected.len() + 1 && inputs.last().is_some_and(|s| s.is_empty()) {
        inputs.pop();
    }
    assert_eq!(
        inputs.len(),
        expected.len(),
        "{name}: .inp and .out disagree on the number of cases"
    );
    let mut bad = 0;
    for (i, (text, want)) in inputs.iter().zip(&expected).enumerate() {
        let got = vocab.tokenize(text, false, false);
        if &got != want {
            bad += 1;
            println!("{name} case {i} {text:?}\n  want {want:?}\n  got  {got:?}");
        }
    }
    println!("{name}: {} cases, {bad} mismatching", inputs.len());
    Some((inputs.len(), bad))
}

macro_rules! suite {
    ($test:ident, $name:literal) => {
        #[test]
        fn $test() {
            if let Some((n, bad)) = run_suite($name) {
                assert!(n > 0);
                assert_eq!(bad, 0, "{} of {} cases differ from llama.cpp", bad, n);
            }
        }
    };
}

suite!(llama_spm, "llama-spm");
suite!(phi_3, "phi-3");
suite!(gpt_2, "gpt-2");
suite!(llama_bpe, "llama-bpe");
suite!(qwen2, "qwen2");
suite!(deepseek_coder, "deepseek-coder");

/// llama.cpp's WordPiece (BERT) suite, `ggml-vocab-bert-bge.gguf` from llama.cpp's `models/`
/// folder (llama-cpp-python 0.3.36's sdist, llama.cpp 0c1e570): taken from
/// `../shared/vocab/` when it is there, else from `$MODELC_LLAMA_CPP/models/` (a llama.cpp
/// source folder), else from `~/.cache/modelc/llama.cpp-models/`, where
/// `scripts/fetch-llama-vocab` (run by `scripts/test`) puts it.
#[test]
fn bert_bge() {
    let name = "ggml-vocab-bert-bge.gguf";
    let shared = modelc_tests::shared_root().join("vocab").join(name);
    let from_src = std::env::var_os("MODELC_LLAMA_CPP")
        .map(|s| std::path::PathBuf::from(s).join("models").join(name));
    let cached = std::env::var_os("HOME").map(|h| {
        std::path::PathBuf::from(h)
            .join(".cache/modelc/llama.cpp-models")
            .join(name)
    });
    let found = [Some(shared), from_src]
        .into_iter()
        .flatten()
        .find(|p| p.exists());
    let path = match found {
        Some(p) => p,
        None => {
            let Some(p) = modelc_tests::require(
                cached.unwrap_or_default(),
                "run scripts/fetch-llama-vocab (scripts/test does)",
            ) else {
                return;
            };
            p
        }
    };
    let (n, bad) = run_suite_at(&path).expect("suite runs");
    assert!(n > 0);
    assert_eq!(bad, 0, "{bad} of {n} cases differ from llama.cpp");
    // With special tokens: [CLS] ... [SEP], as llama-tokenize gives them.
    let vocab = Vocab::from_gguf(&GgufFile::open(&path).unwrap()).unwrap();
    assert_eq!(
        vocab.tokenize("Hello World! Äpfel café", true, false),
        [101, 7592, 2088, 999, 9706, 7959, 2140, 7668, 102]
    );
    assert_eq!(
        vocab.tokenize("[CLS] x [SEP] [MASK]", true, true),
        [101, 101, 1060, 102, 103, 102]
    );
    assert_eq!(
        vocab.detokenize(&[101, 7592, 2088, 999, 102], true),
        b"[CLS] hello world![SEP]"
    );
}
