//! llama.cpp's common flags that scripts pass to `llama-completion` / `llama-cli`
//! (`common/arg.cpp`), taken by `modelc run`, `repl`, `perplexity`, `bench`, `serve` and a
//! runner so that such a command line runs unchanged. Each does what it means where it
//! means something for modelc (`--mlock`: `-lm mlock`); one that asks for what modelc
//! already does (`--no-warmup`: nothing is warmed up; `--no-display-prompt`: only the
//! generated text is printed; `--log-disable`: there is no log) is taken silently; one that
//! asks for something modelc has no use for gets one note line on stderr (`-ngl 99` on the
//! CPU: nothing to offload). Flags naming a feature modelc lacks (LoRA, multimodal
//! projectors, speculative decoding, ...) are refused with the reason ([`refusal`]).

use crate::backend::Target;

/// Engine-level flags: offloading, threads for prompts, memory locking, NUMA, warm-up, logs.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct EngineCompat {
    /// `-ngl N|auto|all`: layers to offload to the GPU (llama.cpp's; comma-separated in
    /// bench). modelc runs every layer on its target (`--backend` / `--target`): on the CPU
    /// there is nothing to offload, on a GPU everything is; noted on stderr.
    #[arg(long = "n-gpu-layers", visible_alias = "gpu-layers", value_name = "N", value_parser = parse_gpu_layers, allow_negative_numbers = true)]
    pub n_gpu_layers: Option<String>,
    /// `-tb N`: threads for prompts (llama.cpp's). modelc uses `-t` for prompts and
    /// generation alike; noted on stderr.
    #[arg(
        long = "threads-batch",
        value_name = "N",
        allow_negative_numbers = true
    )]
    pub threads_batch: Option<i64>,
    /// Read the model into memory and lock it in RAM: `-lm mlock` (older llama.cpp's flag).
    #[arg(long = "mlock", conflicts_with_all = ["load_mode", "mmap"])]
    pub mlock: bool,
    /// Map the model: `-lm mmap` (older llama.cpp's flag).
    #[arg(long = "mmap", conflicts_with_all = ["load_mode", "no_mmap"])]
    pub mmap: bool,
    /// llama.cpp's NUMA placement (`distribute`, `isolate`, `numactl`); modelc's thread pool
    /// does not place threads by node: noted on stderr.
    #[arg(long = "numa", value_name = "TYPE", value_parser = ["distribute", "isolate", "numactl"])]
    pub numa: Option<String>,
    /// Keep the KV cache in host memory (`-nkvo`): where it is on the CPU; a GPU target keeps
    /// it on the GPU (noted on stderr).
    #[arg(long = "no-kv-offload", overrides_with = "kv_offload")]
    pub no_kv_offload: bool,
    /// The KV cache on the GPU (`-kvo`), llama.cpp's default.
    #[arg(long = "kv-offload", overrides_with = "no_kv_offload")]
    pub kv_offload: bool,
    /// Warm up with an empty run first: modelc's kernels are compiled ahead and need none
    /// (noted on stderr).
    #[arg(long = "warmup", overrides_with = "no_warmup")]
    pub warmup: bool,
    /// No warm-up run: modelc does none.
    #[arg(long = "no-warmup", overrides_with = "warmup")]
    pub no_warmup: bool,
    /// No log output: modelc prints no log, only the warnings and errors of what it is
    /// asked to do.
    #[arg(long = "log-disable")]
    pub log_disable: bool,
}

/// Generation-level flags: what is printed around the generated text, the template engine.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct GenCompat {
    /// Print the prompt before the generated text (llama-completion's default): modelc
    /// prints only the generated text (noted on stderr).
    #[arg(long = "display-prompt", overrides_with = "no_display_prompt")]
    pub display_prompt: bool,
    /// Do not print the prompt: modelc prints only the generated text anyway.
    #[arg(long = "no-display-prompt", overrides_with = "display_prompt")]
    pub no_display_prompt: bool,
    /// `-co [on|off|auto]`: colour the prompt and user input apart from the generated text;
    /// modelc's output is plain text (`on` is noted on stderr).
    #[arg(long = "color", visible_alias = "colour", value_name = "on|off|auto", num_args = 0..=1, default_missing_value = "on", value_parser = parse_color)]
    pub color: Option<String>,
    /// Print the prompt's tokens before generating: use `modelc tokenize` (noted on stderr).
    #[arg(long = "verbose-prompt")]
    pub verbose_prompt: bool,
    /// Print llama.cpp's performance timings at the end: `--json` has them in `timings`
    /// (noted on stderr).
    #[arg(long = "perf", overrides_with = "no_perf")]
    pub perf: bool,
    /// No performance timings: modelc prints none.
    #[arg(long = "no-perf", overrides_with = "perf")]
    pub no_perf: bool,
    /// Plain line input in a conversation: what modelc reads when stdin is not a terminal.
    #[arg(long = "simple-io")]
    pub simple_io: bool,
}

/// `-ngl`'s value as llama.cpp takes it: a whole number, `auto` or `all` (bench: several,
/// comma-separated).
fn parse_gpu_layers(s: &str) -> Result<String, String> {
    let ok = s
        .split(',')
        .all(|v| v == "auto" || v == "all" || v.trim().parse::<i64>().is_ok());
    if ok {
        Ok(s.to_string())
    } else {
        Err("expected a number of layers, auto or all".into())
    }
}

/// `--color`'s value as llama.cpp's `is_truthy` / `is_falsey` / `is_autoy` read it, as
/// `on`, `off` or `auto`.
fn parse_color(s: &str) -> Result<String, String> {
    match s.to_ascii_lowercase().as_str() {
        "on" | "enabled" | "true" | "1" => Ok("on".into()),
        "off" | "disabled" | "false" | "0" => Ok("off".into()),
        "auto" | "-1" => Ok("auto".into()),
        _ => Err("expected on, off or auto".into()),
    }
}

/// Prints `message` as one `NAME: note: ...` line on stderr, once per process (a command
/// checks its flags more than once).
pub(crate) fn note(message: String) {
    static SAID: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
    let mut said = SAID
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if !said.contains(&message) {
        eprintln!("{}: note: {message}", crate::cli::prog());
        said.push(message);
    }
}

impl EngineCompat {
    /// Whether `--mlock` or `--mmap` chose the load mode.
    pub fn load_mode(&self) -> Option<super::compile::LoadMode> {
        use super::compile::LoadMode;
        match (self.mlock, self.mmap) {
            (true, _) => Some(LoadMode::Mlock),
            (false, true) => Some(LoadMode::Mmap),
            _ => None,
        }
    }

    /// The note lines for flags that change nothing on `target` (the interpreter is the
    /// CPU's), each printed once.
    pub fn notes(&self, target: Target) {
        if let Some(n) = &self.n_gpu_layers {
            match target {
                Target::Cpu => note(format!(
                    "-ngl {n}: modelc runs this model on the CPU; nothing to offload"
                )),
                gpu => note(format!(
                    "-ngl {n}: modelc runs every layer on the {} GPU (for none, run on the CPU)",
                    gpu.name()
                )),
            }
        }
        if let Some(t) = self.threads_batch {
            note(format!(
                "-tb {t}: modelc uses the -t threads for prompts too"
            ));
        }
        if let Some(n) = &self.numa {
            note(format!(
                "--numa {n}: modelc does not place threads by NUMA node; ignored"
            ));
        }
        if self.no_kv_offload && target != Target::Cpu {
            note(format!(
                "-nkvo: the {} target keeps the KV cache on the GPU",
                target.name()
            ));
        }
        if self.warmup {
            note("--warmup: modelc's kernels are compiled ahead; there is no warm-up run".into());
        }
    }
}

impl GenCompat {
    /// The note lines for flags that ask for output modelc does not print, each printed once.
    pub fn notes(&self) {
        if self.display_prompt {
            note("--display-prompt: modelc prints only the generated text".into());
        }
        if self.color.as_deref() == Some("on") {
            note("--color: modelc prints plain text".into());
        }
        if self.verbose_prompt {
            note("--verbose-prompt: see the prompt's tokens with `modelc tokenize`".into());
        }
        if self.perf {
            note("--perf: modelc prints no timings; --json has them in \"timings\"".into());
        }
    }
}

/// `--jinja` / `--no-jinja`, for `run`, `repl`, `serve` and a runner's generation and
/// serving.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct JinjaArgs {
    /// Render chat templates with the Jinja engine: modelc always does.
    #[arg(long = "jinja", overrides_with = "no_jinja")]
    pub jinja: bool,
    /// llama.cpp's built-in template formats instead of Jinja: modelc renders the Jinja
    /// template (built-in names with `--chat-template NAME`); noted on stderr.
    #[arg(long = "no-jinja", overrides_with = "jinja")]
    pub no_jinja: bool,
}

impl JinjaArgs {
    /// The note line for `--no-jinja`, printed once.
    pub fn notes(&self) {
        if self.no_jinja {
            note("--no-jinja: modelc renders chat templates with Jinja (built-in formats: --chat-template NAME)".into());
        }
    }
}

/// llama.cpp's multi-letter short flags for the flags above, for llama-server's
/// ([`crate::server::flags`]) and for [`refusal`]'s, with the long forms `normalize_args`
/// rewrites them to.
pub const SHORT_FORMS: [(&str, &str); 65] = [
    ("-tb", "--threads-batch"),
    ("-nkvo", "--no-kv-offload"),
    ("-kvo", "--kv-offload"),
    ("-co", "--color"),
    ("-sp", "--special"),
    ("-if", "--interactive-first"),
    ("-mm", "--mmproj"),
    ("-mmu", "--mmproj-url"),
    ("-md", "--model-draft"),
    ("-ot", "--override-tensor"),
    ("-hf", "--hf-repo"),
    ("-mu", "--model-url"),
    ("-gan", "--grp-attn-n"),
    ("-gaw", "--grp-attn-w"),
    ("-bf", "--binary-file"),
    ("-cmoe", "--cpu-moe"),
    // llama-server's
    ("-to", "--timeout"),
    ("-rea", "--reasoning"),
    ("-sps", "--slot-prompt-similarity"),
    ("-nocb", "--no-cont-batching"),
    ("-cb", "--cont-batching"),
    ("-lv", "--verbosity"),
    ("-cram", "--cache-ram"),
    ("-ctxcp", "--ctx-checkpoints"),
    ("-cms", "--checkpoint-min-step"),
    ("-Cr", "--cpu-range"),
    ("-Cb", "--cpu-mask-batch"),
    ("-Crb", "--cpu-range-batch"),
    ("-nr", "--no-repack"),
    ("-dev", "--device"),
    ("-sm", "--split-mode"),
    ("-ts", "--tensor-split"),
    ("-mg", "--main-gpu"),
    ("-fitt", "--fit-target"),
    ("-fitc", "--fit-ctx"),
    ("-fit", "--fit"),
    ("-dt", "--defrag-thold"),
    ("-lzm", "--lazy-mode"),
    ("-bs", "--backend-sampling"),
    ("-jf", "--json-schema-file"),
    ("-no-ag", "--no-agent"),
    ("-ag", "--agent"),
    ("-lcs", "--lookup-cache-static"),
    ("-lcd", "--lookup-cache-dynamic"),
    ("-ncmoe", "--n-cpu-moe"),
    ("-ncffn", "--n-cpu-ffn"),
    ("-dr", "--docker-repo"),
    ("-hfr", "--hf-repo"),
    ("-hff", "--hf-file"),
    ("-hft", "--hf-token"),
    ("-cl", "--cache-list"),
    ("-hfd", "--hf-repo-draft"),
    ("-hfrd", "--hf-repo-draft"),
    ("-ctkd", "--cache-type-k-draft"),
    ("-ctvd", "--cache-type-v-draft"),
    ("-devd", "--device-draft"),
    ("-ngld", "--n-gpu-layers-draft"),
    ("-td", "--threads-draft"),
    ("-tbd", "--threads-batch-draft"),
    ("-Cd", "--cpu-mask-draft"),
    ("-Crd", "--cpu-range-draft"),
    ("-Cbd", "--cpu-mask-batch-draft"),
    ("-otd", "--override-tensor-draft"),
    ("-cmoed", "--cpu-moe-draft"),
    ("-ncmoed", "--n-cpu-moe-draft"),
];

/// Why modelc refuses llama.cpp's flag `flag` (a long form, or a one-letter short one), or
/// `None` for a flag that is not one of llama.cpp's for a feature modelc lacks.
pub fn refusal(flag: &str) -> Option<&'static str> {
    Some(match flag {
        "--lora" | "--lora-scaled" | "--lora-init-without-apply" => {
            "LoRA adapters are not supported; merge the adapter into the GGUF first"
        }
        "--control-vector" | "--control-vector-scaled" | "--control-vector-layer-range" => {
            "control vectors are not supported"
        }
        "--mmproj" | "--mmproj-url" | "--image" | "--audio" | "--video" => {
            "multimodal input (a projector, images, audio) is not supported; modelc runs text models"
        }
        "--draft" | "--draft-max" | "--draft-min" | "--draft-n" | "--draft-n-min" => {
            "llama.cpp removed this flag; the draft's length is --spec-draft-n-max / --spec-draft-n-min with -md, --spec-ngram-simple-size-m with ngram-simple"
        }
        "--rpc" => "RPC backends are not supported",
        "--override-tensor" | "--cpu-moe" | "--n-cpu-moe" => {
            "tensor placement overrides are not supported: every tensor lives on the target"
        }
        "--override-kv" => "metadata overrides are not supported; edit the GGUF instead",
        "--rope-scaling" | "--rope-scale" | "--rope-freq-base" | "--rope-freq-scale"
        | "--yarn-orig-ctx" | "--yarn-ext-factor" | "--yarn-attn-factor" | "--yarn-beta-slow"
        | "--yarn-beta-fast" => {
            "RoPE overrides are not supported: modelc uses the model's own RoPE settings"
        }
        "--grp-attn-n" | "--grp-attn-w" => "group attention (self-extend) is not supported",
        "--hf-repo" | "--hf-file" | "--model-url" => {
            "modelc does not download models; pass a local GGUF file"
        }
        "--prompt-cache" | "--prompt-cache-all" | "--prompt-cache-ro" => {
            "prompt cache files are not supported"
        }
        "--interactive" | "--interactive-first" | "-i" | "--in-prefix" | "--in-suffix"
        | "--in-prefix-bos" => {
            "llama-completion's interactive mode is not supported; chat with -cnv (or modelc repl)"
        }
        "--special" => "printing special tokens' text is not supported",
        "--embedding" | "--embeddings" | "--pooling" | "--embd-normalize" => {
            "embeddings are computed by modelc embed and served by modelc serve --embedding"
        }
        "--rerank" | "--reranking" => "reranking is served by modelc serve --reranking",
        "--ui-config" | "--webui-config" | "--ui-config-file" | "--webui-config-file" => {
            "the chat page takes no configuration"
        }
        "--ui-mcp-proxy" | "--webui-mcp-proxy" | "--tools" | "--tools-runtime"
        | "--mcp-servers-config" | "--mcp-servers-json" | "--agent" => {
            "server-side tools (MCP, the agent's tools and proxy) are not supported"
        }
        "--ssl-key-file" | "--ssl-cert-file" => {
            "HTTPS is not supported; put a TLS proxy in front of modelc serve"
        }
        "--slot-save-path" => "saving and restoring slots is not supported",
        "--props" => "changing the server's settings through POST /props is not supported",
        "--media-path" | "--image-min-tokens" | "--image-max-tokens"
        | "--mtmd-batch-max-tokens" | "--video-fps" | "--video-timestamp-interval"
        | "--video-ffmpeg-dir" => {
            "multimodal input (a projector, images, audio) is not supported; modelc runs text models"
        }
        "--models-dir" | "--models-preset" | "--models-max" | "--models-autoload" => {
            "router mode (several models, loaded on request) is not supported; serve one GGUF file"
        }
        "--lookup-cache-static" | "--lookup-cache-dynamic" => {
            "lookup decoding (speculative) is not supported"
        }
        f if f.starts_with("--spec-") || f.starts_with("--draft") || f.ends_with("-draft") => {
            "this speculative-decoding setting is not supported: the draft model (-md) runs on the main model's backend, threads and cache types; modelc has --spec-draft-n-max/-n-min/-p-min and --spec-type ngram-simple|draft-simple"
        }
        "--embd-gemma-default" | "--fim-qwen-1.5b-default" | "--fim-qwen-3b-default"
        | "--fim-qwen-7b-default" | "--fim-qwen-7b-spec" | "--fim-qwen-14b-spec"
        | "--fim-qwen-30b-default" | "--gpt-oss-20b-default" | "--gpt-oss-120b-default"
        | "--vision-gemma-4b-default" | "--vision-gemma-12b-default" => {
            "preset models are downloaded from Hugging Face; modelc does not download models"
        }
        "--docker-repo" | "--hf-token" | "--cache-list" => {
            "modelc does not download models; pass a local GGUF file"
        }
        "--n-cpu-ffn" => "tensor placement overrides are not supported: every tensor lives on the target",
        "--adaptive-target" | "--adaptive-decay" => "the adaptive-p sampler is not supported",
        "-l" | "--logit-bias" => {
            "a command-line logit bias is not supported; give \"logit_bias\" in requests"
        }
        "--reasoning-budget-message" | "--reasoning-preserve" => {
            "a reasoning budget message and preserving reasoning across turns are not supported"
        }
        "--log-prompts-dir" => "logging prompts to files is not supported",
        "--list-devices" => "modelc lists no devices; pick one with --backend",
        "--completion-bash" => "there is no bash completion script",
        "--binary-file" => "binary prompt files are not supported; use -f FILE",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every short form rewrites to a flag that is either taken ([`EngineCompat`],
    /// [`GenCompat`]) or refused with a reason.
    #[test]
    fn short_forms_are_taken_or_refused() {
        let taken = [
            "--threads-batch",
            "--no-kv-offload",
            "--kv-offload",
            "--color",
            "--timeout",
            "--reasoning",
            "--slot-prompt-similarity",
            "--no-cont-batching",
            "--cont-batching",
            "--verbosity",
            "--cache-ram",
            "--ctx-checkpoints",
            "--checkpoint-min-step",
            "--cpu-range",
            "--cpu-mask-batch",
            "--cpu-range-batch",
            "--no-repack",
            "--device",
            "--split-mode",
            "--tensor-split",
            "--main-gpu",
            "--fit-target",
            "--fit-ctx",
            "--fit",
            "--defrag-thold",
            "--lazy-mode",
            "--backend-sampling",
            "--json-schema-file",
            "--no-agent",
        ];
        for (short, long) in SHORT_FORMS {
            assert!(
                taken.contains(&long) || refusal(long).is_some(),
                "{short} -> {long}"
            );
        }
    }
}
