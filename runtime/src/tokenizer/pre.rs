//! BPE pre-tokenizer types: the `tokenizer.ggml.pre` names llama.cpp accepts, the settings each
//! name implies, and the split expressions of each type.
//!
//! Source: llama.cpp `src/llama-vocab.cpp` (`llama_vocab::impl::load`, the `tokenizer_pre`
//! chain, and `llm_tokenizer_bpe`'s `regex_exprs` per `LLAMA_VOCAB_PRE_TYPE_*`). The
//! expressions are the ones published in each model family's `tokenizer.json`, written here in
//! the ECMAScript dialect llama.cpp runs them in (see [`super::split`] for how they are run).

/// A pre-tokenizer type (llama.cpp `LLAMA_VOCAB_PRE_TYPE_*`).
#[allow(missing_docs)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PreType {
    Default,
    Llama3,
    Jais2,
    Dbrx,
    Smaug,
    DeepseekLlm,
    Deepseek3Llm,
    HunyuanDense,
    JoyaiLlm,
    HyV4,
    Spark2_5,
    Youtu,
    DeepseekCoder,
    Falcon,
    Starcoder,
    Refact,
    CommandR,
    Smollm,
    Codeshell,
    Exaone,
    Minerva,
    Mellum2,
    Gpt2,
    Mpt,
    Olmo,
    Jais,
    Trillion,
    GraniteDocling,
    Stablelm2,
    Qwen2,
    Hunyuan,
    SolarOpen,
    Qwen35,
    Poro,
    Bloom,
    Gpt3Finnish,
    Chatglm4,
    Viking,
    Tekken,
    Chameleon,
    Gpt4o,
    MinimaxM2,
    GraniteEmbMulti,
    TinyAya,
    KimiK2,
    Superbpe,
    Bailingmoe,
    SeedCoder,
    Ufakzeka,
    Grok2,
    Afmoe,
    Laguna,
    ExaoneMoe,
    Gemma4,
    SarvamMoe,
    Minicpm5,
    Whitespace,
}

/// What a `tokenizer.ggml.pre` name sets besides the type (llama.cpp's per-name overrides of
/// the BPE defaults `clean_spaces = true`, `ignore_merges = false`, `add_bos = false`).
#[derive(Clone, Copy, Debug)]
pub struct PreSettings {
    /// The pre-tokenizer type.
    pub pre_type: PreType,
    /// `clean_up_tokenization_spaces` in detokenization.
    pub clean_spaces: bool,
    /// A pre-tokenized word that is itself a token is emitted whole, without merges.
    pub ignore_merges: bool,
    /// Forces `add_bos = true` (before the `add_bos_token` key is read).
    pub add_bos: bool,
    /// Forces `add_sep = true` (before the `add_sep_token` key is read).
    pub add_sep: bool,
    /// Spaces are written as U+2581 before BPE (SPM-style BPE).
    pub escape_whitespaces: bool,
    /// The default BOS id is cleared (chatglm).
    pub no_default_bos: bool,
}

/// Looks up a `tokenizer.ggml.pre` value. `None` for a name llama.cpp does not know (llama.cpp
/// refuses to load such a file; the caller decides what to do).
pub fn settings_for(name: &str) -> Option<PreSettings> {
    use PreType::*;
    let s = |pre_type: PreType| PreSettings {
        pre_type,
        clean_spaces: true,
        ignore_merges: false,
        add_bos: false,
        add_sep: false,
        escape_whitespaces: false,
        no_default_bos: false,
    };
    let nc = |t: PreType| PreSettings {
        clean_spaces: false,
        ..s(t)
    };
    Some(match name {
        "default" => s(Default),
        "minicpm5" => PreSettings {
            ignore_merges: true,
            ..s(Minicpm5)
        },
        "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral" | "midm-2.0"
        | "lfm2" | "jina-v5-nano" => PreSettings {
            ignore_merges: true,
            add_bos: true,
            ..s(Llama3)
        },
        "deepseek-llm" => nc(DeepseekLlm),
        "deepseek-coder" => nc(DeepseekCoder),
        "deepseek-v3" => nc(Deepseek3Llm),
        "spark2_5" => nc(Spark2_5),
        "youtu" => PreSettings {
            ignore_merges: true,
            ..nc(Youtu)
        },
        "falcon" => s(Falcon),
        "mpt" => s(Mpt),
        "starcoder" => s(Starcoder),
        "gpt-2" | "phi-2" | "jina-es" | "jina-de" | "gigachat" | "jina-v2-es" | "jina-v2-de"
        | "a.x-4.0" | "mellum" | "modern-bert" | "exaone4" => s(Gpt2),
        "jais-2" => s(Jais2),
        "gemma4" | "granite-embed-multi-311m" => PreSettings {
            escape_whitespaces: true,
            ..s(Gemma4)
        },
        "sarvam-moe" => PreSettings {
            escape_whitespaces: true,
            ..nc(SarvamMoe)
        },
        "jina-v1-en" | "jina-v2-code" | "roberta-bpe" => PreSettings {
            add_sep: true,
            ..s(Gpt2)
        },
        "whitespace" => s(Whitespace),
        "refact" => s(Refact),
        "command-r" => nc(CommandR),
        "qwen2" | "deepseek-r1-qwen" | "kormo" | "f2llmv2" => nc(Qwen2),
        "qwen35" => nc(Qwen35),
        "stablelm2" => s(Stablelm2),
        "olmo" => s(Olmo),
        "dbrx" => s(Dbrx),
        "smaug-bpe" => s(Smaug),
        "poro-chat" => nc(Poro),
        "glm4" | "chatglm-bpe" => PreSettings {
            no_default_bos: true,
            ..s(Chatglm4)
        },
        "viking" => nc(Viking),
        "jais" => s(Jais),
        "tekken" => PreSettings {
            ignore_merges: true,
            add_bos: true,
            ..nc(Tekken)
        },
        "smollm" => nc(Smollm),
        "codeshell" => s(Codeshell),
        "bloom" => s(Bloom),
        "gpt3-finnish" => s(Gpt3Finnish),
        "exaone" => s(Exaone),
        "exaone-moe" => s(ExaoneMoe),
        "chameleon" => PreSettings {
            add_bos: true,
            ..nc(Chameleon)
        },
        "minerva-7b" => s(Minerva),
        "megrez" => s(Qwen2),
        "gpt-4o" | "llama4" | "kanana2" | "talkie" => nc(Gpt4o),
        "granite-embed-multi-97m" => PreSettings {
            ignore_merges: true,
            ..nc(GraniteEmbMulti)
        },
        "tiny_aya" | "cohere2moe" => nc(TinyAya),
        "superbpe" => nc(Superbpe),
        "trillion" => nc(Trillion),
        "granite-docling" => nc(GraniteDocling),
        "bailingmoe" | "bailingmoe2" | "llada-moe" => nc(Bailingmoe),
        "seed-coder" => nc(SeedCoder),
        "hunyuan" => nc(Hunyuan),
        "hunyuan-dense" => nc(HunyuanDense),
        "hy_v4" => nc(HyV4),
        "joyai-llm" => nc(JoyaiLlm),
        "kimi-k2" => nc(KimiK2),
        "ufakzeka" => nc(Ufakzeka),
        "grok-2" => nc(Grok2),
        "afmoe" => nc(Afmoe),
        "laguna" => nc(Laguna),
        "minimax-m2" => nc(MinimaxM2),
        "solar-open" => nc(SolarOpen),
        "mellum2" => s(Mellum2),
        _ => return None,
    })
}

/// GPT-2's split expression; llama.cpp runs it with a hand-written splitter.
pub const GPT2_RE: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";

/// Llama 3's split expression (case-insensitive contractions spelled out); llama.cpp runs it
/// with a hand-written splitter.
pub const LLAMA3_RE: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Qwen 2's split expression: Llama 3's with single digits. llama.cpp runs it through its
/// general regex engine; modelc has an equivalent hand-written splitter (tested against the
/// general engine).
pub const QWEN2_RE: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Kimi-K2's trigger expression (llama.cpp runs all of K2's rules in one custom splitter).
pub const KIMI_K2_RE: &str = r"\p{Han}+";

/// AFMoE's digit-grouping trigger (custom splitter in llama.cpp).
pub const AFMOE_DIGITS_RE: &str = r"\p{AFMoE_digits}";

const GPT4O_RE: &str = r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";

const DEEPSEEK3_MAIN_RE: &str = "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+";

const BLOOM_RE: &str = r" ?[^(\s|.,!?…。，、।۔،)]+";

/// The split expressions of a pre-tokenizer type, applied in order (each one splits the pieces
/// the previous ones produced), and whether the pieces are then mapped through the GPT-2 byte
/// alphabet.
pub fn regex_exprs(t: PreType) -> (Vec<&'static str>, bool) {
    use PreType::*;
    let v: Vec<&'static str> = match t {
        Llama3 | Dbrx | Smaug | Chatglm4 => vec![LLAMA3_RE],
        Jais2 => vec![
            r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s{512}(?!\S)|\s{256}(?!\S)|\s{128}(?!\S)|\s{64}(?!\S)|\s{32}(?!\S)|\s{16}(?!\S)|\s{8}(?!\S)|\s{4}(?!\S)|\s{1,2}(?!\S)|\s{1}",
        ],
        DeepseekLlm => vec![
            "[\r\n]",
            // cased letters (Lu, Ll, Lt), as code points: NFC would fold some of them
            "\\s?[A-Za-z\u{B5}\u{C0}-\u{D6}\u{D8}-\u{F6}\u{F8}-\u{1BA}\u{1BC}-\u{1BF}\u{1C4}-\u{293}\u{295}-\u{2AF}\u{370}-\u{373}\u{376}\u{377}\u{37B}-\u{37D}\u{37F}\u{386}\u{388}-\u{38A}\u{38C}\u{38E}-\u{3A1}\u{3A3}-\u{3F5}\u{3F7}-\u{481}\u{48A}-\u{52F}\u{531}-\u{556}\u{10A0}-\u{10C5}\u{13A0}-\u{13F5}\u{13F8}-\u{13FD}\u{1C90}-\u{1CBA}\u{1CBD}-\u{1CBF}\u{1D00}-\u{1D2B}\u{1D6B}-\u{1D77}\u{1D79}-\u{1D9A}\u{1E00}-\u{1F15}\u{1F18}-\u{1F1D}\u{1F20}-\u{1F45}\u{1F48}-\u{1F4D}\u{1F50}-\u{1F57}\u{1F59}\u{1F5B}\u{1F5D}\u{1F5F}-\u{1F7D}\u{1F80}-\u{1FB4}\u{1FB6}-\u{1FBC}\u{1FBE}\u{1FC2}-\u{1FC4}\u{1FC6}-\u{1FCC}\u{1FD0}-\u{1FD3}\u{1FD6}-\u{1FDB}\u{1FE0}-\u{1FEC}\u{1FF2}-\u{1FF4}\u{1FF6}-\u{1FFC}\u{2102}\u{2107}\u{210A}-\u{2113}\u{2115}\u{2119}-\u{211D}\u{2124}\u{2126}\u{2128}\u{212A}-\u{212D}\u{212F}-\u{2134}\u{2139}\u{213C}-\u{213F}\u{2145}-\u{2149}\u{214E}\u{2183}\u{2184}\u{2C00}-\u{2C7B}\u{2C7E}-\u{2CE4}\u{2CEB}-\u{2CEE}\u{2CF2}\u{2CF3}\u{A640}-\u{A66D}\u{A680}-\u{A69B}\u{A722}-\u{A76F}\u{A771}-\u{A787}\u{A78B}-\u{A78E}\u{AB70}-\u{ABBF}\u{FB00}-\u{FB06}\u{FB13}-\u{FB17}\u{FF21}-\u{FF3A}\u{FF41}-\u{FF5A}\u{10400}-\u{1044F}\u{104B0}-\u{104D3}\u{104D8}-\u{104FB}\u{10C80}-\u{10CB2}\u{10CC0}-\u{10CF2}\u{118A0}-\u{118DF}\u{1E900}-\u{1E943}]+",
            r"\s?[!-/:-~！-／：-～‘-‟　-。]+",
            r"\s+$",
            r"[一-龥ࠀ-一가-퟿]+",
            r"\p{N}+",
        ],
        Deepseek3Llm | HunyuanDense | JoyaiLlm | HyV4 => {
            vec![r"\p{N}{1,3}", r"[一-龥぀-ゟ゠-ヿ]+", DEEPSEEK3_MAIN_RE]
        }
        Spark2_5 => vec![
            r"\p{N}{1,3}",
            r"[一-龥぀-ゟ゠-ヿ]+",
            "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+|[\r\n]|\\s+(?!\\S)|\\s+",
            r"\p{N}",
        ],
        Youtu => vec![
            r"[가-힣ㄱ-ㆎ]+|[！…“”‘’—：；，、-〿︰-﹏]+|[ㄅ-ㄯ]+|[一-龥぀-ゟ゠-ヿ]+",
            r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",
        ],
        DeepseekCoder => vec!["[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", r"[一-龥ࠀ-一가-퟿]+", r"\p{N}"],
        Falcon => vec![r"[\p{P}\$\+<=>\^~\|`]+", GPT2_RE, r"[0-9][0-9][0-9]"],
        Starcoder | Refact | CommandR | Smollm | Codeshell | Exaone | Minerva | Mellum2 => {
            vec![r"\p{N}", GPT2_RE]
        }
        Gpt2 | Mpt | Olmo | Jais | Trillion | GraniteDocling => vec![GPT2_RE],
        Stablelm2 | Qwen2 | Hunyuan | SolarOpen => vec![QWEN2_RE],
        Qwen35 => vec![
            r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
        ],
        Poro | Bloom | Gpt3Finnish => vec![BLOOM_RE],
        Viking => vec![BLOOM_RE, r"\p{N}"],
        Tekken => vec![
            r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",
        ],
        Chameleon => vec![
            r"<sentinel:[0-9]+>",
            r"(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z",
            r"([\t\n]|    |  )",
            r"\p{N}",
            r"[\p{P}!-/:-@\[-`{-~]",
            GPT2_RE,
        ],
        Gpt4o | MinimaxM2 => vec![GPT4O_RE],
        GraniteEmbMulti => vec![
            r"[^\r\n\p{L}\p{N}]?((?=[\p{L}\p{M}])([^a-z]))*((?=[\p{L}\p{M}])([^A-Z]))+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\r\n\p{L}\p{N}]?((?=[\p{L}\p{M}])([^a-z]))+((?=[\p{L}\p{M}])([^A-Z]))*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",
        ],
        TinyAya => vec![
            r"\d{1,3}(?=(?:\d{3})*\b)",
            r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",
        ],
        KimiK2 => vec![KIMI_K2_RE],
        Superbpe => vec![r"\p{N}+", r"(?=(\d{3})+(?!\d))"],
        Bailingmoe => vec![
            r"'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+",
        ],
        SeedCoder => vec![
            r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+|\s+(?!\S)|\s+",
        ],
        Ufakzeka => vec![
            r"[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
        ],
        Grok2 => vec![QWEN2_RE],
        Afmoe => vec![
            AFMOE_DIGITS_RE,
            "[\u{4E00}-\u{9FFF}\u{3400}-\u{4DBF}\u{F900}-\u{FAFF}\u{3040}-\u{309F}\u{30A0}-\u{30FF}\u{FF65}-\u{FF9F}\u{2F00}-\u{2FDF}\u{E40}-\u{E7F}\u{E80}-\u{EFF}\u{1780}-\u{17FF}\u{1000}-\u{109F}\u{AA60}-\u{AA7F}\u{A9E0}-\u{A9FF}\u{AC00}-\u{D7AF}\u{1100}-\u{11FF}]+",
            "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\\r\\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
        ],
        Laguna => vec![r"[^\n]+|[\n]+", QWEN2_RE],
        ExaoneMoe => vec![
            r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?(?:\p{L}\p{M}*(?: \p{L}\p{M}*)*)+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]?|\s*[\r\n]|\s+(?!\S)|\s+",
        ],
        Gemma4 | SarvamMoe => return (vec![r"[^\n]+|[\n]+"], false),
        Minicpm5 => vec![
            r"\p{N}{1,3}",
            r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}+| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
        ],
        Whitespace => return (vec![r"\S+"], false),
        Default => vec![r"[\p{P}\$\+<=>\^~\|]+", GPT2_RE, r"\p{N}+", r"[0-9][0-9][0-9]"],
    };
    (v, true)
}
