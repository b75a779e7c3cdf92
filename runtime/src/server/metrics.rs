//! `/metrics`: llama-server's counters and gauges in Prometheus text format, with its metric
//! names (`tools/server/server-task.cpp` `server_task_result_metrics::to_metrics`).

use std::fmt::Write;

/// Counters the inference thread keeps.
#[derive(Clone, Debug, Default)]
pub struct Metrics {
    /// Prompt tokens evaluated (not those reused from a slot's cache).
    pub prompt_tokens: u64,
    /// Prompt tokens reused from a slot's cache.
    pub prompt_cached: u64,
    /// Seconds spent on prompts.
    pub prompt_seconds: f64,
    /// Tokens generated.
    pub predicted_tokens: u64,
    /// Seconds spent generating.
    pub predicted_seconds: f64,
    /// `decode_batch` calls.
    pub n_decode: u64,
    /// Busy slots summed over the `decode_batch` calls.
    pub n_busy_slots: u64,
    /// Largest sequence seen (prompt + generated).
    pub n_tokens_max: u64,
    /// Slots running a request now.
    pub requests_processing: usize,
}

impl Metrics {
    /// The Prometheus text, with `deferred` requests waiting in the queue.
    pub fn to_prometheus(&self, deferred: usize) -> String {
        let per_second = |n: u64, s: f64| if s > 0.0 { n as f64 / s } else { 0.0 };
        let counters: [(&str, &str, f64); 10] = [
            (
                "prompt_tokens_total",
                "Number of prompt tokens processed, excluding cached tokens",
                self.prompt_tokens as f64,
            ),
            (
                "prompt_tokens_cached_total",
                "Number of prompt tokens reused from the cache",
                self.prompt_cached as f64,
            ),
            (
                "prompt_seconds_total",
                "Total time spent processing prompts",
                self.prompt_seconds,
            ),
            (
                "tokens_predicted_total",
                "Number of generation tokens processed",
                self.predicted_tokens as f64,
            ),
            (
                "tokens_predicted_seconds_total",
                "Total time spent generating tokens",
                self.predicted_seconds,
            ),
            (
                "n_decode_total",
                "Total number of decode calls",
                self.n_decode as f64,
            ),
            (
                "n_tokens_max",
                "Largest observed sequence length (prompt + generation)",
                self.n_tokens_max as f64,
            ),
            (
                "spec_decode_num_draft_tokens_total",
                "Speculative: Total draft tokens generated (no speculative decoding: 0)",
                0.0,
            ),
            (
                "spec_decode_num_accepted_tokens_total",
                "Speculative: Total draft tokens accepted by the target model (0)",
                0.0,
            ),
            (
                "spec_decode_num_drafts_total",
                "Speculative: Total speculative decoding verification steps (0)",
                0.0,
            ),
        ];
        let gauges: [(&str, &str, f64); 5] = [
            (
                "prompt_tokens_seconds",
                "Average prompt throughput in tokens/s",
                per_second(self.prompt_tokens, self.prompt_seconds),
            ),
            (
                "predicted_tokens_seconds",
                "Average generation throughput in tokens/s",
                per_second(self.predicted_tokens, self.predicted_seconds),
            ),
            (
                "requests_processing",
                "Number of requests processing",
                self.requests_processing as f64,
            ),
            (
                "requests_deferred",
                "Number of requests deferred",
                deferred as f64,
            ),
            (
                "n_busy_slots_per_decode",
                "Average number of busy slots per decode call",
                self.n_busy_slots as f64 / (self.n_decode.max(1) as f64),
            ),
        ];
        let mut out = String::new();
        for (kind, items) in [("counter", &counters[..]), ("gauge", &gauges[..])] {
            for (name, help, value) in items {
                let _ = writeln!(out, "# HELP llamacpp:{name} {help}");
                let _ = writeln!(out, "# TYPE llamacpp:{name} {kind}");
                let _ = writeln!(out, "llamacpp:{name} {value}");
            }
        }
        out
    }
}
