//! Lazy grammars, as llama.cpp has them (`llama_grammar` with `lazy`, `src/llama-grammar.cpp`
//! `llama_grammar_accept_impl`; the triggers built in `common/sampling.cpp`): the model writes
//! freely until a trigger appears in its output — a word, a regular expression found
//! anywhere, one that matches the whole output so far, or a token — and from there on the
//! grammar holds. The text from where the trigger starts (the pattern's first non-empty
//! capture group, else the whole match) is fed to the grammar when it fires, so the
//! grammar's `root` describes the text beginning with the trigger (a tool call's
//! `<tool_call>`, say), not what came before it.
//!
//! [`Constraint`] is what a generation holds: a [`Matcher`] that is either active or waiting
//! for its trigger. While waiting it allows every token and masks nothing.

use super::matcher::{Matcher, Rules};
use crate::tokenizer::TokenId;
use std::sync::Arc;

/// One trigger of a lazy grammar (llama.cpp's `common_grammar_trigger`; the `type` numbers
/// of llama-server's `grammar_triggers` field: 0 token, 1 word, 2 pattern, 3 full pattern).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Trigger {
    /// This token, when sampled, starts the grammar (it is the grammar's first token).
    Token(TokenId),
    /// This text, anywhere in the output.
    Word(String),
    /// A regular expression found anywhere in the output.
    Pattern(String),
    /// A regular expression matching the whole output so far (anchored at both ends).
    PatternFull(String),
}

/// A lazy grammar's triggers, compiled ([`Trigger`]).
#[derive(Debug)]
pub struct Triggers {
    tokens: Vec<TokenId>,
    patterns: Vec<fancy_regex::Regex>,
}

impl Triggers {
    /// Compiles `triggers`.
    ///
    /// # Errors
    /// A pattern that is not a valid regular expression, naming it.
    pub fn new(triggers: &[Trigger]) -> Result<Triggers, String> {
        let mut tokens = Vec::new();
        let mut patterns = Vec::new();
        for t in triggers {
            let source = match t {
                Trigger::Token(id) => {
                    tokens.push(*id);
                    continue;
                }
                Trigger::Word(w) => fancy_regex::escape(w).into_owned(),
                Trigger::Pattern(p) => p.clone(),
                Trigger::PatternFull(p) => {
                    let start = if p.starts_with('^') { "" } else { "^" };
                    let end = if p.ends_with('$') && !p.is_empty() {
                        ""
                    } else {
                        "$"
                    };
                    format!("{start}(?:{p}){end}")
                }
            };
            let re = fancy_regex::Regex::new(&source)
                .map_err(|e| format!("grammar trigger pattern {source:?}: {e}"))?;
            patterns.push(re);
        }
        Ok(Triggers { tokens, patterns })
    }

    /// Where in `buffer` the first pattern that matches starts the grammar: its first
    /// non-empty capture group, else the whole match (llama.cpp
    /// `llama_grammar_trigger_pattern::find`). Token triggers are not looked for.
    pub fn find(&self, buffer: &str) -> Option<usize> {
        for re in &self.patterns {
            let Ok(Some(caps)) = re.captures(buffer) else {
                continue;
            };
            let group = (1..caps.len())
                .filter_map(|i| caps.get(i))
                .find(|m| !m.as_str().is_empty());
            if let Some(m) = group.or_else(|| caps.get(0)) {
                return Some(m.start());
            }
        }
        None
    }
}

/// A grammar as one generation applies it: always, or after a trigger (module doc).
#[derive(Clone, Debug)]
pub struct Constraint {
    matcher: Matcher,
    /// `Some` while a lazy grammar waits for its trigger: the triggers, the output so far and
    /// each token's span in it.
    waiting: Option<Waiting>,
}

#[derive(Clone, Debug)]
struct Waiting {
    triggers: Arc<Triggers>,
    buffer: String,
    spans: Vec<(TokenId, usize, usize)>,
}

impl Constraint {
    /// `rules` applied from the first token, or with `triggers` only once one fires.
    pub fn new(rules: Arc<Rules>, triggers: Option<Arc<Triggers>>) -> Constraint {
        Constraint {
            matcher: Matcher::new(rules),
            waiting: triggers.map(|triggers| Waiting {
                triggers,
                buffer: String::new(),
                spans: Vec::new(),
            }),
        }
    }

    /// Whether a lazy grammar still waits for its trigger.
    pub fn is_waiting(&self) -> bool {
        self.waiting.is_some()
    }

    /// Whether token `id` is allowed here (always, while waiting).
    pub fn allows(&mut self, id: TokenId) -> bool {
        self.waiting.is_some() || self.matcher.allows(id)
    }

    /// Masks the tokens the grammar rejects ([`Matcher::apply`]); nothing while waiting.
    pub fn apply(&mut self, logits: &mut [f32]) {
        if self.waiting.is_none() {
            self.matcher.apply(logits);
        }
    }

    /// Advances past token `id`, whose text is `piece` (special tokens rendered). While
    /// waiting, the piece joins the output and the triggers are looked for; when one fires
    /// the grammar takes the output from where the trigger starts.
    ///
    /// # Errors
    /// The token (or the triggered text) does not fit the grammar.
    pub fn accept(&mut self, id: TokenId, piece: &[u8]) -> Result<(), String> {
        let Some(w) = self.waiting.as_mut() else {
            return self.matcher.accept(id);
        };
        if w.triggers.tokens.contains(&id) {
            self.waiting = None;
            return self.matcher.accept(id);
        }
        let start = w.buffer.len();
        w.buffer.push_str(&String::from_utf8_lossy(piece));
        w.spans.push((id, start, w.buffer.len()));
        let Some(at) = w.triggers.find(&w.buffer) else {
            return Ok(());
        };
        let Some(w) = self.waiting.take() else {
            return Ok(());
        };
        // The tokens from the trigger on go to the grammar again: whole ones as tokens
        // (a grammar may name them), the one the trigger starts inside as text.
        for &(tok, s, e) in &w.spans {
            if e <= at {
                continue;
            }
            if s >= at {
                self.matcher.accept(tok)?;
            } else {
                let text = w.buffer.get(at..e).unwrap_or("");
                if !self.matcher.accept_str(text) {
                    return Err(format!(
                        "the triggered text {text:?} does not fit the grammar"
                    ));
                }
            }
        }
        Ok(())
    }
}
