//! Inputs that must not break the tokenizer: a 10 MB text, text full of special-token
//! look-alikes, every kind of Unicode; and round trips through the detokenizer and the
//! streaming decoder.

use ir::gguf::GgufFile;
use runtime::tokenizer::{StreamDecoder, Vocab, VocabType};
use std::sync::OnceLock;
use std::time::Instant;

/// The suites' vocabularies (in shared/) plus the real models, loaded once for all tests of
/// this file; whatever is absent is a recorded skip (a failure under `MODELC_REQUIRE_MODELS=1`).
fn vocabularies() -> &'static [(String, Vocab)] {
    static VOCABS: OnceLock<Vec<(String, Vocab)>> = OnceLock::new();
    VOCABS.get_or_init(load_vocabularies)
}

fn load_vocabularies() -> Vec<(String, Vocab)> {
    let mut out = Vec::new();
    let mut paths = Vec::new();
    if let Some(s) = modelc_tests::shared("vocab") {
        for name in [
            "llama-spm",
            "phi-3",
            "gpt-2",
            "llama-bpe",
            "qwen2",
            "deepseek-coder",
        ] {
            paths.push(s.join(format!("ggml-vocab-{name}.gguf")));
        }
    }
    paths.extend(modelc_tests::smollm2());
    paths.extend(modelc_tests::gemma3());
    for p in paths {
        let file = GgufFile::open(&p).unwrap_or_else(|e| panic!("{e}"));
        let v = Vocab::from_gguf(&file).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        out.push((
            p.file_name()
                .unwrap_or_default()
                .to_string_lossy()
                .into_owned(),
            v,
        ));
    }
    out
}

/// Deterministic text of `len` pieces drawn from `pool`.
fn mix(pool: &[&str], len: usize, mut seed: u64) -> String {
    let mut s = String::new();
    for _ in 0..len {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        s.push_str(pool[((seed >> 33) as usize) % pool.len()]);
    }
    s
}

const LOOKALIKES: &[&str] = &[
    "<|im_start|>",
    "<|im_end|>",
    "<|im_start|",
    "|im_end|>",
    "<|",
    "|>",
    "<",
    ">",
    "<s>",
    "</s>",
    "</s",
    "<unk>",
    "<0x0A>",
    "<0xZZ>",
    "<bos>",
    "<eos>",
    "<start_of_turn>",
    "<end_of_turn",
    "<|endoftext|>",
    "<|begin_of_text|>",
    "<|eot_id|>",
    "<｜end▁of▁sentence｜>",
    "<|<|im_end|>|>",
    "▁",
    " ",
    "\n",
    "user",
    "é",
    "😀",
    "\u{0}",
    "[PAD]",
    "<pad>",
    "<mask>",
    "<unused0>",
];

#[test]
fn special_token_lookalikes_do_not_break_anything() {
    let text = mix(LOOKALIKES, 20_000, 1);
    for (name, v) in vocabularies() {
        for parse_special in [false, true] {
            let ids = v.tokenize(&text, true, parse_special);
            assert!(ids.iter().all(|&id| (id as usize) < v.n_vocab()), "{name}");
            let _ = v.detokenize(&ids, true);
        }
    }
}

#[test]
fn byte_level_vocabularies_round_trip_any_text() {
    // Byte-level vocabularies cover every byte, so detokenize(tokenize(text)) gives the
    // text back (special tokens included when rendered) unless the vocabulary asks for
    // llama.cpp's clean-up of spaces before punctuation (llama-bpe and gpt-2 do).
    let pool = [
        LOOKALIKES,
        &[
            "Hello", " world", "\t", "\r\n", "123456", "'s", " ,", "ÅÄÖ", "中文", "\u{3000}",
            "\u{85}",
        ],
    ]
    .concat();
    let mut checked = 0;
    for (name, v) in vocabularies() {
        if v.vocab_type() != VocabType::Bpe || v.clean_spaces() {
            continue;
        }
        checked += 1;
        for seed in 0..20 {
            let text = mix(&pool, 200, seed);
            for parse_special in [false, true] {
                let ids = v.tokenize(&text, false, parse_special);
                let back = v.detokenize(&ids, true);
                assert_eq!(String::from_utf8_lossy(&back), text, "{name} seed {seed}");
            }
        }
    }
    if modelc_tests::shared_root().join("vocab").is_dir() {
        assert!(checked >= 2, "qwen2 and deepseek-coder at least");
    }
}

#[test]
fn streaming_decoder_gives_back_the_text_without_partial_characters() {
    let text = "Café, naïve, Zürich, 東京, Москва — emoji: 🚀🎉👍🏽 😀.\n\n\tend";
    for (name, v) in vocabularies() {
        let ids = v.tokenize(text, false, false);
        let mut dec = StreamDecoder::new(false);
        let mut got = String::new();
        for &id in &ids {
            got.push_str(&dec.push(v, id));
            assert!(dec.pending() <= 3);
        }
        got.push_str(&dec.flush());
        let whole = String::from_utf8_lossy(
            &ids.iter()
                .flat_map(|&id| v.token_to_piece(id, false).to_vec())
                .collect::<Vec<u8>>(),
        )
        .into_owned();
        assert_eq!(got, whole, "{name}");
        if !name.contains("spm") && !name.contains("phi-3") {
            // no space prefix to strip: the stream is the text itself
            assert_eq!(got, text, "{name}");
        }
    }
}

#[test]
fn shortcuts_give_the_same_ids_as_the_plain_algorithms() {
    let pool = [
        LOOKALIKES,
        &[
            "Hello", " world", "  ", "\t", "\r\n", "123", "'s", "the", " the", "ÅÄÖ", "中文", "ab",
            "ba", ">", " </", "▁▁",
        ],
    ]
    .concat();
    for (name, v) in vocabularies() {
        for seed in 0..30 {
            let text = mix(&pool, 150, seed);
            for parse_special in [false, true] {
                assert_eq!(
                    v.tokenize(&text, true, parse_special),
                    v.tokenize_plain(&text, true, parse_special),
                    "{name} seed {seed}: {text:?}"
                );
            }
        }
    }
}

#[test]
fn ten_megabytes_of_text_tokenize_in_linear_time() {
    let Some(text) = modelc_tests::shared("reference/ppl-text.txt") else {
        return;
    };
    let prose = std::fs::read_to_string(text).expect("read ppl-text.txt");
    let mut big = String::with_capacity(10 << 20);
    while big.len() < 10 << 20 {
        big.push_str(&prose);
    }
    let unit = &big[..1 << 20];
    for (name, v) in vocabularies() {
        if !(name.contains("gpt-2") || name.contains("llama-spm")) {
            continue;
        }
        let t = Instant::now();
        let n_small = v.tokenize(unit, false, false).len();
        let small = t.elapsed().as_secs_f64();
        let t = Instant::now();
        let n_big = v.tokenize(&big, false, false).len();
        let large = t.elapsed().as_secs_f64();
        println!("{name}: 1 MiB {small:.3} s, 10 MiB {large:.3} s, {n_big} tokens");
        assert!(n_big > 9 * n_small, "{name}");
        // 10x the text may take at most ~25x the time (no quadratic blow-up)
        assert!(
            large < 25.0 * small + 1.0,
            "{name}: {large} s for 10 MiB vs {small} s for 1 MiB"
        );
    }
}

/// Bytes that are not UTF-8 tokenize as llama.cpp 0c1e570 tokenizes them (`llama-tokenize
/// -bf FILE --ids --no-bos`, recorded below): SPM falls back to byte tokens for each symbol
/// its lead byte cuts (`▁` `E6 AD`: `29871 233 176`), BPE decodes overlong forms and
/// surrogates to code points and other bad bytes to U+FFFD one byte at a time.
#[test]
fn invalid_utf8_tokenizes_as_llama_cpp() {
    #[rustfmt::skip]
    let cases: &[(&str, &[u8], &[u32])] = &[
        ("llama-spm", b"\xe6\xad", &[29871, 233, 176]),
        ("llama-bpe", b"\xe6\xad", &[10178]),
        ("gpt-2", b"\xe6\xad", &[6353]),
        ("qwen2", b"\xe6\xad", &[9973]),
        ("llama-spm", b"a\xe6\xadb", &[263, 233, 176, 101]),
        ("llama-bpe", b"a\xe6\xadb", &[64, 10178, 65]),
        ("qwen2", b"a\xe6\xadb", &[64, 9973, 65]),
        ("llama-spm", b"\xed\xa0\x80", &[29871, 240, 163, 131]),
        ("llama-bpe", b"\xed\xa0\x80", &[169, 64319]),
        ("gpt-2", b"\xed\xa0\x80", &[169, 254, 222]),
        ("qwen2", b"\xed\xa0\x80", &[169, 63219]),
        ("llama-spm", b"x\xc0\xafy", &[921, 195, 178, 29891]),
        ("llama-bpe", b"x\xc0\xafy", &[87, 27589]),
        ("gpt-2", b"x\xc0\xafy", &[87, 14, 88]),
        ("qwen2", b"x\xc0\xafy", &[87, 26491]),
        ("llama-spm", b"\xff\xfe z", &[29871, 258, 257, 229, 153, 132, 29920]),
        ("llama-bpe", b"\xff\xfe z", &[10178, 1167]),
        ("gpt-2", b"\xff\xfe z", &[6353, 1976]),
        ("llama-spm", b"\xf0\x8d\xa0\x80 q", &[29871, 243, 144, 163, 131, 3855]),
        ("llama-bpe", b"\xf0\x8d\xa0\x80 q", &[169, 64319, 2874]),
        ("gpt-2", b"\xf0\x8d\xa0\x80 q", &[169, 254, 222, 10662]),
        ("llama-spm", b"\xf4\x8f\xbf\xbd\xed\xb0\x80 x", &[29871, 247, 146, 194, 192, 240, 179, 131, 921]),
        ("llama-bpe", b"\xf4\x8f\xbf\xbd\xed\xb0\x80 x", &[176, 237, 123, 121, 169, 108, 222, 865]),
        ("gpt-2", b"\xf4\x8f\xbf\xbd\xed\xb0\x80 x", &[176, 237, 4204, 169, 108, 222, 2124]),
        ("qwen2", b"\xf4\x8f\xbf\xbd\xed\xb0\x80 x", &[176, 237, 123, 121, 169, 108, 222, 856]),
    ];
    let vocabs = vocabularies();
    for &(name, input, want) in cases {
        let file = format!("ggml-vocab-{name}.gguf");
        let Some((_, v)) = vocabs.iter().find(|(n, _)| *n == file) else {
            continue;
        };
        assert_eq!(
            v.tokenize_bytes(input, false, false),
            want,
            "{name} {input:x?}"
        );
    }
}
