//! llama-server's flags (`common/arg.cpp`, the options of `LLAMA_EXAMPLE_SERVER`) that
//! `modelc serve` takes besides its own [`super::ServerArgs`], so that a llama-server command
//! line starts modelc unchanged. Those that mean something here do it (`--api-key-file`,
//! `--no-cache-prompt`, `--cors-*`, `--reasoning`, `--chat-template-kwargs`); those that ask
//! for what modelc has no use for (nothing to download: `--offline`; no log: `--verbose`;
//! CPU affinity, device splits, idle-slot caches) are taken with one note line on stderr;
//! flags naming a feature modelc lacks are refused by `cli::llama_flags::refusal`.

use crate::cli::llama_flags::note;
use std::path::PathBuf;

/// llama-server's flags besides [`super::ServerArgs`]' own (module doc).
#[derive(clap::Args, Debug, Clone, Default)]
pub struct ServerCompat {
    /// API keys, one a line, besides `--api-key`'s.
    #[arg(long = "api-key-file", value_name = "FNAME")]
    pub api_key_file: Option<PathBuf>,
    /// Requests reuse the slot's cached prompt unless they say `"cache_prompt": false` (the
    /// default).
    #[arg(long = "cache-prompt", overrides_with = "no_cache_prompt")]
    pub cache_prompt: bool,
    /// Requests recompute the whole prompt unless they say `"cache_prompt": true`.
    #[arg(long = "no-cache-prompt", overrides_with = "cache_prompt")]
    pub no_cache_prompt: bool,
    /// Origins allowed by CORS, comma-separated: `*` (the default) allows any, `localhost`
    /// only `localhost`, `127.0.0.1` and `::1` origins (llama-server's rules).
    #[arg(long = "cors-origins", value_name = "ORIGINS")]
    pub cors_origins: Option<String>,
    /// Methods a CORS preflight allows (default: `GET, POST, DELETE, OPTIONS`).
    #[arg(long = "cors-methods", value_name = "METHODS")]
    pub cors_methods: Option<String>,
    /// Headers a CORS preflight allows (default: `*`).
    #[arg(long = "cors-headers", value_name = "HEADERS")]
    pub cors_headers: Option<String>,
    /// CORS with credentials (the default): with `--cors-origins *` the request's own origin
    /// is allowed back.
    #[arg(long = "cors-credentials", overrides_with = "no_cors_credentials")]
    pub cors_credentials: bool,
    /// CORS without credentials: `--cors-origins *` answers `*`.
    #[arg(long = "no-cors-credentials", overrides_with = "cors_credentials")]
    pub no_cors_credentials: bool,
    /// `-rea on|off|auto`: the chat template's `enable_thinking` (`on`: true, `off`: false,
    /// `auto`: the template's own default).
    #[arg(long = "reasoning", value_name = "on|off|auto", value_parser = parse_on_off_auto)]
    pub reasoning: Option<String>,
    /// Extra variables for the chat template, a JSON object (`{"enable_thinking": false}`);
    /// a request's own `chat_template_kwargs` override them.
    #[arg(long = "chat-template-kwargs", value_name = "JSON")]
    pub chat_template_kwargs: Option<String>,
    /// `--reasoning-format none|deepseek|deepseek-legacy|auto`: where a chat reply's
    /// thoughts (`<think>...</think>`) go: left in `content` (`none`), or split into
    /// `reasoning_content` (the others; `deepseek-legacy` also keeps them in `content`).
    /// Default `auto`, as llama-server.
    #[arg(long = "reasoning-format", value_name = "FORMAT", value_parser = parse_reasoning_format)]
    pub reasoning_format: Option<String>,
    /// `--reasoning-budget N`: thinking tokens allowed, -1 unlimited (the default), 0 none
    /// (the template's `enable_thinking` is false, and a thought the model opens anyway is
    /// closed at once), N > 0: the thought is closed after N tokens.
    #[arg(long = "reasoning-budget", value_name = "N", allow_hyphen_values = true,
          value_parser = clap::value_parser!(i64).range(-1..))]
    pub reasoning_budget: Option<i64>,
    /// The chat template's `reasoning_effort` (`default`: the template's own).
    #[arg(long = "reasoning-effort", value_name = "LEVEL")]
    pub reasoning_effort: Option<String>,
    /// Leave the model's output unparsed: no reasoning split out, no tool calls read.
    #[arg(long = "skip-chat-parsing", overrides_with = "no_skip_chat_parsing")]
    pub skip_chat_parsing: bool,
    /// Parse the model's output (the default).
    #[arg(long = "no-skip-chat-parsing", overrides_with = "skip_chat_parsing")]
    pub no_skip_chat_parsing: bool,

    // Taken with a note: nothing for modelc to do.
    /// Do not download (noted: modelc never downloads).
    #[arg(long = "offline")]
    pub offline: bool,
    /// `-v`: log everything (noted: modelc keeps no log).
    #[arg(short = 'v', long = "verbose", visible_alias = "log-verbose")]
    pub verbose: bool,
    /// `-lv N`: log verbosity (noted: modelc keeps no log).
    #[arg(long = "verbosity", visible_alias = "log-verbosity", value_name = "N")]
    pub verbosity: Option<String>,
    /// Log to FNAME (noted: modelc keeps no log; its messages go to stderr).
    #[arg(long = "log-file", value_name = "FNAME")]
    pub log_file: Option<String>,
    /// Log colours (taken: modelc keeps no log).
    #[arg(long = "log-colors", value_name = "on|off|auto", num_args = 0..=1, default_missing_value = "on")]
    pub log_colors: Option<String>,
    /// Log prefixes (taken: modelc keeps no log).
    #[arg(long = "log-prefix", overrides_with = "no_log_prefix")]
    pub log_prefix: bool,
    /// No log prefixes (taken).
    #[arg(long = "no-log-prefix", overrides_with = "log_prefix")]
    pub no_log_prefix: bool,
    /// Log timestamps (taken: modelc keeps no log).
    #[arg(long = "log-timestamps", overrides_with = "no_log_timestamps")]
    pub log_timestamps: bool,
    /// No log timestamps (taken).
    #[arg(long = "no-log-timestamps", overrides_with = "log_timestamps")]
    pub no_log_timestamps: bool,
    /// JSON-lines log (taken: modelc keeps no log).
    #[arg(long = "log-jsonl", overrides_with = "no_log_jsonl")]
    pub log_jsonl: bool,
    /// Plain log (taken).
    #[arg(long = "no-log-jsonl", overrides_with = "log_jsonl")]
    pub no_log_jsonl: bool,
    /// `-nocb`: no continuous batching (noted: modelc always batches continuously).
    #[arg(long = "no-cont-batching")]
    pub no_cont_batching: bool,
    /// HTTP threads (noted: modelc's HTTP side is asynchronous on two threads).
    #[arg(long = "threads-http", value_name = "N", allow_negative_numbers = true)]
    pub threads_http: Option<i64>,
    /// Bind with SO_REUSEPORT (noted: modelc binds its port alone).
    #[arg(long = "reuse-port")]
    pub reuse_port: bool,
    /// Seconds between SSE pings (noted: modelc sends none).
    #[arg(
        long = "sse-ping-interval",
        value_name = "N",
        allow_negative_numbers = true
    )]
    pub sse_ping_interval: Option<String>,
    /// Reuse cached chunks by KV shifting (noted: modelc reuses the common prefix only).
    #[arg(long = "cache-reuse", value_name = "N", allow_negative_numbers = true)]
    pub cache_reuse: Option<String>,
    /// `-sps`: prompt similarity for picking a slot (noted: modelc picks the slot with the
    /// longest common prefix).
    #[arg(long = "slot-prompt-similarity", value_name = "SIMILARITY")]
    pub slot_prompt_similarity: Option<String>,
    /// Unload the model after N idle seconds (noted: modelc keeps it loaded).
    #[arg(
        long = "sleep-idle-seconds",
        value_name = "SECONDS",
        allow_negative_numbers = true
    )]
    pub sleep_idle_seconds: Option<String>,
    /// Keep idle slots' caches in host memory (taken: modelc keeps each slot's cache).
    #[arg(long = "cache-idle-slots", overrides_with = "no_cache_idle_slots")]
    pub cache_idle_slots: bool,
    /// Do not keep idle slots' caches (taken).
    #[arg(long = "no-cache-idle-slots", overrides_with = "cache_idle_slots")]
    pub no_cache_idle_slots: bool,
    /// `-cram N`: MiB of host prompt cache (noted: modelc keeps one cache per slot).
    #[arg(long = "cache-ram", value_name = "N", allow_negative_numbers = true)]
    pub cache_ram: Option<String>,
    /// `-ctxcp N`: context checkpoints per slot (noted: modelc's caches rewind without).
    #[arg(
        long = "ctx-checkpoints",
        visible_alias = "swa-checkpoints",
        value_name = "N"
    )]
    pub ctx_checkpoints: Option<String>,
    /// `-cms N`: tokens between checkpoints (noted, as `--ctx-checkpoints`).
    #[arg(long = "checkpoint-min-step", value_name = "N")]
    pub checkpoint_min_step: Option<String>,
    /// Per-slot limit in a unified cache (noted: each slot may use the whole pool).
    #[arg(long = "kv-unified-per-slot", value_name = "N")]
    pub kv_unified_per_slot: Option<String>,
    /// `-C M`: CPU affinity mask (noted: modelc does not pin threads).
    #[arg(short = 'C', long = "cpu-mask", value_name = "M")]
    pub cpu_mask: Option<String>,
    /// `-Cr lo-hi`: CPU range (noted, as `-C`).
    #[arg(long = "cpu-range", value_name = "lo-hi")]
    pub cpu_range: Option<String>,
    /// Strict CPU placement (noted, as `-C`).
    #[arg(long = "cpu-strict", value_name = "<0|1>")]
    pub cpu_strict: Option<String>,
    /// Thread priority (noted: modelc's threads run at the process's priority).
    #[arg(long = "prio", value_name = "N", allow_negative_numbers = true)]
    pub prio: Option<String>,
    /// Polling level (noted: modelc's workers spin, then park).
    #[arg(long = "poll", value_name = "<0...100>")]
    pub poll: Option<String>,
    /// `-Cb M`: as `-C`, for prompts.
    #[arg(long = "cpu-mask-batch", value_name = "M")]
    pub cpu_mask_batch: Option<String>,
    /// `-Crb lo-hi`: as `-Cr`, for prompts.
    #[arg(long = "cpu-range-batch", value_name = "lo-hi")]
    pub cpu_range_batch: Option<String>,
    /// As `--cpu-strict`, for prompts.
    #[arg(long = "cpu-strict-batch", value_name = "<0|1>")]
    pub cpu_strict_batch: Option<String>,
    /// As `--prio`, for prompts.
    #[arg(long = "prio-batch", value_name = "N", allow_negative_numbers = true)]
    pub prio_batch: Option<String>,
    /// As `--poll`, for prompts.
    #[arg(long = "poll-batch", value_name = "<0|1>")]
    pub poll_batch: Option<String>,
    /// Repack weights for the CPU (taken: modelc lays weights out at compile time).
    #[arg(long = "repack", overrides_with = "no_repack")]
    pub repack: bool,
    /// `-nr`: no repacking (taken, as `--repack`).
    #[arg(long = "no-repack", overrides_with = "repack")]
    pub no_repack: bool,
    /// No host buffer (taken: nothing to offload from).
    #[arg(long = "no-host")]
    pub no_host: bool,
    /// Offload host ops to the device (taken: every op runs on the target).
    #[arg(long = "op-offload", overrides_with = "no_op_offload")]
    pub op_offload: bool,
    /// No op offload (taken).
    #[arg(long = "no-op-offload", overrides_with = "op_offload")]
    pub no_op_offload: bool,
    /// Check tensor data (noted: modelc checks every tensor's bounds when it opens a GGUF).
    #[arg(long = "check-tensors")]
    pub check_tensors: bool,
    /// `-dev LIST`: devices (noted: modelc's device is `--backend`'s).
    #[arg(long = "device", value_name = "<dev1,dev2,..>")]
    pub device: Option<String>,
    /// `-sm MODE`: split over GPUs (noted: modelc runs on one device).
    #[arg(long = "split-mode", value_name = "MODE")]
    pub split_mode: Option<String>,
    /// `-ts LIST`: split proportions (noted, as `-sm`).
    #[arg(long = "tensor-split", value_name = "N0,N1,...")]
    pub tensor_split: Option<String>,
    /// `-mg N`: main GPU (noted, as `-sm`).
    #[arg(long = "main-gpu", value_name = "INDEX")]
    pub main_gpu: Option<String>,
    /// `-fit on|off`: fit the context to device memory (noted: modelc plans memory at
    /// compile time).
    #[arg(long = "fit", value_name = "on|off")]
    pub fit: Option<String>,
    /// `-fitt LIST`: free memory targets for `-fit` (noted).
    #[arg(long = "fit-target", value_name = "MiB0,...")]
    pub fit_target: Option<String>,
    /// `-fitc N`: smallest context for `-fit` (noted).
    #[arg(long = "fit-ctx", value_name = "N")]
    pub fit_ctx: Option<String>,
    /// `-dt N`: KV defragmentation threshold (deprecated in llama.cpp; noted).
    #[arg(long = "defrag-thold", value_name = "N", allow_negative_numbers = true)]
    pub defrag_thold: Option<String>,
    /// `-lzm MODE`: on-demand tensor reads (noted: modelc maps the file, `-lm`).
    #[arg(long = "lazy-mode", value_name = "MODE")]
    pub lazy_mode: Option<String>,
    /// `-bs`: sample on the device (noted: modelc samples on the CPU, with the same result).
    #[arg(long = "backend-sampling")]
    pub backend_sampling: bool,
    /// Multimodal projector downloaded with `-hf` (taken: modelc downloads none).
    #[arg(long = "mmproj-auto", overrides_with_all = ["no_mmproj", "no_mmproj_auto"])]
    pub mmproj_auto: bool,
    /// No multimodal projector (taken: modelc runs text models).
    #[arg(long = "no-mmproj", overrides_with_all = ["mmproj_auto", "no_mmproj_auto"])]
    pub no_mmproj: bool,
    /// As `--no-mmproj` (taken).
    #[arg(long = "no-mmproj-auto", overrides_with_all = ["mmproj_auto", "no_mmproj"])]
    pub no_mmproj_auto: bool,
    /// Projector on the GPU (taken: there is no projector).
    #[arg(long = "mmproj-offload", overrides_with = "no_mmproj_offload")]
    pub mmproj_offload: bool,
    /// Projector on the CPU (taken).
    #[arg(long = "no-mmproj-offload", overrides_with = "mmproj_offload")]
    pub no_mmproj_offload: bool,
    /// No model loaded on request in router mode (taken: modelc serves one model).
    #[arg(long = "no-models-autoload")]
    pub no_models_autoload: bool,
    /// No MCP proxy for the web UI (taken: modelc has none).
    #[arg(long = "no-ui-mcp-proxy", visible_alias = "no-webui-mcp-proxy")]
    pub no_ui_mcp_proxy: bool,
    /// `-no-ag`: no agent tools (taken: modelc has none).
    #[arg(long = "no-agent")]
    pub no_agent: bool,
    /// No reasoning kept across turns (taken: modelc does not split reasoning out).
    #[arg(long = "no-reasoning-preserve")]
    pub no_reasoning_preserve: bool,
    /// No device sampling for a draft model (taken: modelc has none).
    #[arg(long = "no-spec-draft-backend-sampling")]
    pub no_spec_draft_backend_sampling: bool,
}

/// A `--reasoning-format` name ([`crate::chat::reply::ReasoningFormat::parse`]).
fn parse_reasoning_format(s: &str) -> Result<String, String> {
    crate::chat::reply::ReasoningFormat::parse(s).map(|f| f.name().to_string())
}

/// `on` / `off` / `auto` as llama.cpp's `is_truthy` / `is_falsey` / `is_autoy` read them.
fn parse_on_off_auto(s: &str) -> Result<String, String> {
    match s.to_ascii_lowercase().as_str() {
        "on" | "enabled" | "true" | "1" => Ok("on".into()),
        "off" | "disabled" | "false" | "0" => Ok("off".into()),
        "auto" | "-1" => Ok("auto".into()),
        _ => Err("expected on, off or auto".into()),
    }
}

impl ServerCompat {
    /// Checks the values that mean something (`--chat-template-kwargs` a JSON object,
    /// `--api-key-file` readable).
    ///
    /// # Errors
    /// The first bad one, naming its flag.
    pub fn validate(&self) -> anyhow::Result<()> {
        self.template_kwargs()?;
        self.api_keys()?;
        Ok(())
    }

    /// The API keys of `--api-key-file`: its non-empty lines, trimmed.
    ///
    /// # Errors
    /// A file that cannot be read.
    pub fn api_keys(&self) -> anyhow::Result<Vec<String>> {
        let Some(p) = &self.api_key_file else {
            return Ok(Vec::new());
        };
        let text = std::fs::read_to_string(p)
            .map_err(|e| anyhow::anyhow!("--api-key-file {}: {e}", p.display()))?;
        Ok(text
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .map(str::to_string)
            .collect())
    }

    /// The chat template's extra variables: `--chat-template-kwargs`, then `--reasoning`'s
    /// `enable_thinking` and `--reasoning-effort`'s `reasoning_effort` over them.
    ///
    /// # Errors
    /// `--chat-template-kwargs` not a JSON object.
    pub fn template_kwargs(&self) -> anyhow::Result<serde_json::Map<String, serde_json::Value>> {
        let mut kw = match &self.chat_template_kwargs {
            None => serde_json::Map::new(),
            Some(s) => match serde_json::from_str(s) {
                Ok(serde_json::Value::Object(m)) => m,
                Ok(_) => anyhow::bail!("--chat-template-kwargs: expected a JSON object, got {s}"),
                Err(e) => anyhow::bail!("--chat-template-kwargs: not JSON ({e}): {s}"),
            },
        };
        match self.reasoning.as_deref() {
            Some("on") => {
                kw.insert("enable_thinking".into(), true.into());
            }
            Some("off") => {
                kw.insert("enable_thinking".into(), false.into());
            }
            _ => {}
        }
        // No thinking budget: the template is asked not to think (unless told otherwise).
        if self.reasoning_budget == Some(0) && self.reasoning.is_none() {
            kw.entry("enable_thinking").or_insert(false.into());
        }
        if let Some(e) = self.reasoning_effort.as_deref().filter(|e| *e != "default") {
            kw.insert("reasoning_effort".into(), e.into());
        }
        Ok(kw)
    }

    /// `--reasoning-format` (default `auto`).
    pub fn reasoning_format(&self) -> crate::chat::reply::ReasoningFormat {
        self.reasoning_format
            .as_deref()
            .and_then(|f| crate::chat::reply::ReasoningFormat::parse(f).ok())
            .unwrap_or_default()
    }

    /// Whether requests cache their prompt unless they say otherwise.
    pub fn cache_prompt(&self) -> bool {
        !self.no_cache_prompt
    }

    /// The note lines of the flags taken without effect, each printed once.
    pub fn notes(&self) {
        let flag = |on: bool, text: &str| {
            if on {
                note(text.to_string());
            }
        };
        let value = |v: &Option<String>, name: &str, why: &str| {
            if let Some(v) = v {
                note(format!("{name} {v}: {why}"));
            }
        };
        flag(self.offline, "--offline: modelc never downloads anything");
        flag(
            self.verbose,
            "--verbose: modelc keeps no log; requests and errors are answered as usual",
        );
        value(&self.verbosity, "--verbosity", "modelc keeps no log");
        value(
            &self.log_file,
            "--log-file",
            "modelc keeps no log; its messages go to stderr",
        );
        flag(
            self.no_cont_batching,
            "--no-cont-batching: modelc always batches the slots' steps together",
        );
        if let Some(n) = self.threads_http {
            note(format!(
                "--threads-http {n}: modelc's HTTP side runs on two asynchronous threads"
            ));
        }
        flag(self.reuse_port, "--reuse-port: modelc binds its port alone");
        value(
            &self.sse_ping_interval,
            "--sse-ping-interval",
            "modelc sends no SSE pings",
        );
        value(
            &self.cache_reuse,
            "--cache-reuse",
            "modelc reuses a slot's cached common prefix only",
        );
        value(
            &self.slot_prompt_similarity,
            "--slot-prompt-similarity",
            "modelc gives a request the slot with the longest common prefix",
        );
        value(
            &self.sleep_idle_seconds,
            "--sleep-idle-seconds",
            "modelc keeps the model loaded",
        );
        value(
            &self.cache_ram,
            "--cache-ram",
            "modelc keeps one prompt cache per slot",
        );
        value(
            &self.ctx_checkpoints,
            "--ctx-checkpoints",
            "modelc's caches rewind without checkpoints",
        );
        value(
            &self.checkpoint_min_step,
            "--checkpoint-min-step",
            "modelc's caches rewind without checkpoints",
        );
        value(
            &self.kv_unified_per_slot,
            "--kv-unified-per-slot",
            "each slot may use the whole unified pool",
        );
        for (v, name) in [
            (&self.cpu_mask, "--cpu-mask"),
            (&self.cpu_range, "--cpu-range"),
            (&self.cpu_strict, "--cpu-strict"),
            (&self.poll, "--poll"),
            (&self.cpu_mask_batch, "--cpu-mask-batch"),
            (&self.cpu_range_batch, "--cpu-range-batch"),
            (&self.cpu_strict_batch, "--cpu-strict-batch"),
            (&self.poll_batch, "--poll-batch"),
        ] {
            value(v, name, "modelc does not pin or tune its threads");
        }
        value(
            &self.prio,
            "--prio",
            "modelc's threads run at the process's priority",
        );
        value(
            &self.prio_batch,
            "--prio-batch",
            "modelc's threads run at the process's priority",
        );
        flag(
            self.check_tensors,
            "--check-tensors: modelc checks every tensor's bounds when it opens the file",
        );
        value(
            &self.device,
            "--device",
            "modelc runs on --backend's device",
        );
        for (v, name) in [
            (&self.split_mode, "--split-mode"),
            (&self.tensor_split, "--tensor-split"),
            (&self.main_gpu, "--main-gpu"),
        ] {
            value(v, name, "modelc runs the model on one device");
        }
        for (v, name) in [
            (&self.fit, "--fit"),
            (&self.fit_target, "--fit-target"),
            (&self.fit_ctx, "--fit-ctx"),
        ] {
            value(
                v,
                name,
                "modelc plans its memory when it compiles the model",
            );
        }
        value(
            &self.defrag_thold,
            "--defrag-thold",
            "modelc's caches need no defragmentation",
        );
        value(&self.lazy_mode, "--lazy-mode", "modelc maps the file (-lm)");
        flag(
            self.backend_sampling,
            "--backend-sampling: modelc samples on the CPU, with the same result",
        );
    }
}
