//! The assistant's reply read back from the model's text, as llama-server reads it
//! (`common_chat_parse`): reasoning split off (`<think>...</think>`, `--reasoning-format`),
//! then tool calls read by the template's format ([`super::tools`]); and, while streaming,
//! what changed since the last read, as OpenAI's deltas (llama.cpp's
//! `common_chat_msg_diff::compute_diffs`).

use super::tools::{ChatMsg, ToolCall, ToolFormat};

/// `--reasoning-format` (llama.cpp's `common_reasoning_format`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum ReasoningFormat {
    /// Thoughts stay in `content`, tags and all.
    None,
    /// Thoughts go to `reasoning_content`.
    Deepseek,
    /// Thoughts go to `reasoning_content` and also stay in `content` with their tags.
    DeepseekLegacy,
    /// llama-server's default: as `deepseek`.
    #[default]
    Auto,
}

impl ReasoningFormat {
    /// Reads llama.cpp's names: `none`, `deepseek`, `deepseek-legacy`, `auto`.
    ///
    /// # Errors
    /// Another name.
    pub fn parse(s: &str) -> Result<ReasoningFormat, String> {
        match s {
            "none" => Ok(ReasoningFormat::None),
            "deepseek" => Ok(ReasoningFormat::Deepseek),
            "deepseek-legacy" => Ok(ReasoningFormat::DeepseekLegacy),
            "auto" => Ok(ReasoningFormat::Auto),
            other => Err(format!("Unknown reasoning format: {other}")),
        }
    }

    /// llama.cpp's name.
    pub fn name(self) -> &'static str {
        match self {
            ReasoningFormat::None => "none",
            ReasoningFormat::Deepseek => "deepseek",
            ReasoningFormat::DeepseekLegacy => "deepseek-legacy",
            ReasoningFormat::Auto => "auto",
        }
    }
}

/// The tag that opens thoughts.
pub const THINK_START: &str = "<think>";
/// The tag that closes them.
pub const THINK_END: &str = "</think>";

/// Whether a rendered prompt leaves the model inside its thoughts (the template opened
/// `<think>` itself, as DeepSeek R1's does): llama.cpp's `thinking_forced_open`.
pub fn thinking_forced_open(prompt: &str) -> bool {
    prompt.trim_end().ends_with(THINK_START)
}

/// `text` split into reasoning and the rest (module doc). `forced_open`: the prompt opened
/// the thoughts. While `partial`, a closing tag still being written is held back.
pub fn split_reasoning(
    text: &str,
    format: ReasoningFormat,
    forced_open: bool,
    partial: bool,
) -> (String, String) {
    if format == ReasoningFormat::None {
        return (String::new(), text.to_string());
    }
    let body = if forced_open {
        text
    } else {
        let t = text.trim_start();
        match t.strip_prefix(THINK_START) {
            Some(b) => b,
            None => {
                // `<think>` still being written at the start.
                if partial && !t.is_empty() && THINK_START.starts_with(t) {
                    return (String::new(), String::new());
                }
                return (String::new(), text.to_string());
            }
        }
    };
    let (thought, rest) = match body.find(THINK_END) {
        Some(end) => (&body[..end], Some(&body[end + THINK_END.len()..])),
        None if partial => (
            super::tools::without_partial_marker(body, &[THINK_END]),
            None,
        ),
        None => (body, None),
    };
    let reasoning = if partial && rest.is_none() {
        // Trailing whitespace may be followed by more thought.
        thought.trim_start().to_string()
    } else {
        thought.trim().to_string()
    };
    let rest = rest.map_or(String::new(), |r| r.trim_start().to_string());
    if format == ReasoningFormat::DeepseekLegacy {
        return (reasoning, text.to_string());
    }
    (reasoning, rest)
}

/// How a request's reply is read (module doc).
#[derive(Clone, Copy)]
pub struct ReplyParser {
    /// The tool-call format, when the request offers tools and allows calls.
    pub tools: Option<&'static dyn ToolFormat>,
    /// `--reasoning-format` (or the request's `reasoning_format`).
    pub reasoning: ReasoningFormat,
    /// The prompt opened the thoughts ([`thinking_forced_open`]).
    pub forced_open: bool,
}

impl std::fmt::Debug for ReplyParser {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReplyParser")
            .field("tools", &self.tools.map(|t| t.name()))
            .field("reasoning", &self.reasoning)
            .field("forced_open", &self.forced_open)
            .finish()
    }
}

impl ReplyParser {
    /// The reply in `text`; `partial` while it is still being written.
    pub fn parse(&self, text: &str, partial: bool) -> ChatMsg {
        let (reasoning, rest) = split_reasoning(text, self.reasoning, self.forced_open, partial);
        let mut msg = match self.tools {
            Some(f) => f.parse(&rest, partial),
            None => ChatMsg {
                content: rest,
                ..ChatMsg::default()
            },
        };
        msg.reasoning_content = reasoning;
        msg
    }
}

/// One change between two reads of a reply (llama.cpp's `common_chat_msg_diff`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Delta {
    /// More reasoning.
    Reasoning(String),
    /// More content.
    Content(String),
    /// A new call, `index` in the reply's calls.
    Call {
        /// Its place among the calls.
        index: usize,
        /// The call.
        call: ToolCall,
    },
}

/// What `new` adds to `old` (each only grows while a reply is written; text that does not
/// extend the old is not repeated).
pub fn diff(old: &ChatMsg, new: &ChatMsg) -> Vec<Delta> {
    let mut out = Vec::new();
    if let Some(d) = new
        .reasoning_content
        .strip_prefix(old.reasoning_content.as_str())
    {
        if !d.is_empty() {
            out.push(Delta::Reasoning(d.to_string()));
        }
    }
    if let Some(d) = new.content.strip_prefix(old.content.as_str()) {
        if !d.is_empty() {
            out.push(Delta::Content(d.to_string()));
        }
    }
    for (index, call) in new.tool_calls.iter().enumerate().skip(old.tool_calls.len()) {
        out.push(Delta::Call {
            index,
            call: call.clone(),
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn think_split_whole_and_partial() {
        let f = ReasoningFormat::Deepseek;
        let t = "<think>I'm\nthinking</think>Hello";
        assert_eq!(
            split_reasoning(t, f, false, false),
            ("I'm\nthinking".into(), "Hello".into())
        );
        assert_eq!(
            split_reasoning(t, ReasoningFormat::None, false, false),
            (String::new(), t.into())
        );
        assert_eq!(
            split_reasoning("I'm</think>Hi", f, true, false),
            ("I'm".into(), "Hi".into())
        );
        assert_eq!(
            split_reasoning("<think>I'm</thi", f, false, true),
            ("I'm".into(), String::new())
        );
        assert_eq!(
            split_reasoning("<thi", f, false, true),
            (String::new(), String::new())
        );
    }

    #[test]
    fn diff_gives_what_was_added() {
        let a = ChatMsg {
            content: "Hel".into(),
            ..ChatMsg::default()
        };
        let b = ChatMsg {
            content: "Hello".into(),
            tool_calls: vec![ToolCall::default()],
            ..ChatMsg::default()
        };
        let d = diff(&a, &b);
        assert_eq!(d[0], Delta::Content("lo".into()));
        assert!(matches!(d[1], Delta::Call { index: 0, .. }));
        assert!(diff(&b, &b).is_empty());
    }
}
