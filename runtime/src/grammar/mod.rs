//! Grammar-constrained sampling as llama.cpp does it: GBNF grammars ([`parse`]), matched
//! over code points with pushdown stacks ([`matcher`]), against a vocabulary decoded once
//! into a trie of code points ([`tokens`]), and JSON schemas turned into GBNF
//! ([`json_schema`]).
//!
//! Where it acts: [`crate::generate::Decoding`] samples without the grammar, and only when
//! the chosen token is rejected samples again with the rejected tokens' logits at `-inf`
//! (llama.cpp's `common_sampler_sample`, `common/sampling.cpp`), then advances the grammar
//! by the chosen token. Every path (`modelc run`, the runner, the REPL, the server's slots)
//! goes through it.

pub mod json_schema;
pub mod lazy;
pub mod matcher;
pub mod parse;
pub mod tokens;
pub mod utf8;

pub use lazy::{Constraint, Trigger, Triggers};
pub use matcher::{Matcher, Rules};
pub use parse::{Grammar, GrammarError};
pub use tokens::TokenTable;

use crate::tokenizer::Vocab;
use std::sync::Arc;

/// Reads GBNF `text` against `vocab` (for `<token>` references) and prepares it for
/// matching over `tokens` (the table of the same vocabulary).
///
/// # Errors
/// The grammar's first error, one line with its line and column.
pub fn compile(
    text: &str,
    vocab: &Vocab,
    tokens: Arc<TokenTable>,
) -> Result<Arc<Rules>, GrammarError> {
    let lookup = |t: &str| -> Option<u32> {
        match vocab.tokenize(t, false, true).as_slice() {
            [id] => Some(*id),
            _ => None,
        }
    };
    let g = Grammar::parse(text, Some(&lookup))?;
    Ok(Arc::new(Rules::new(&g, tokens)))
}
