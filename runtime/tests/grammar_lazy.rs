//! Lazy grammars (`runtime::grammar::lazy`, llama.cpp's `grammar_lazy` and
//! `grammar_triggers`): nothing is constrained before a trigger, the grammar holds from
//! where the trigger starts, and each kind of trigger (word, pattern anywhere, full
//! pattern, token) fires where llama.cpp's does.

use runtime::grammar::{Constraint, Grammar, Rules, TokenTable, Trigger, Triggers};
use std::sync::Arc;

/// A small vocabulary: single characters, a few words, and an end-of-generation token.
const PIECES: &[&str] = &[
    "a", "b", "c", " ", "<", ">", "x", "{", "}", "<call>", "hello", "ll>{", "<ca", "</s>",
];

fn table() -> Arc<TokenTable> {
    Arc::new(TokenTable::from_pieces(
        PIECES.iter().map(|p| (p.as_bytes().to_vec(), *p == "</s>")),
    ))
}

fn id(piece: &str) -> u32 {
    PIECES.iter().position(|p| *p == piece).unwrap() as u32
}

fn constraint(grammar: &str, triggers: &[Trigger]) -> Constraint {
    let g = Grammar::parse(grammar, None).unwrap();
    let rules = Arc::new(Rules::new(&g, table()));
    let t = (!triggers.is_empty()).then(|| Arc::new(Triggers::new(triggers).unwrap()));
    Constraint::new(rules, t)
}

fn feed(c: &mut Constraint, pieces: &[&str]) -> Result<(), String> {
    for p in pieces {
        c.accept(id(p), p.as_bytes())?;
    }
    Ok(())
}

/// The tokens a constraint masks out of a uniform row.
fn masked(c: &mut Constraint) -> Vec<&'static str> {
    let mut logits = vec![0.0f32; PIECES.len()];
    c.apply(&mut logits);
    PIECES
        .iter()
        .zip(&logits)
        .filter(|(_, l)| l.is_infinite())
        .map(|(p, _)| *p)
        .collect()
}

const CALL: &str = r#"root ::= "<call>" "{" [abc]* "}""#;

#[test]
fn free_until_a_word_then_constrained() {
    let mut c = constraint(CALL, &[Trigger::Word("<call>".into())]);
    assert!(c.is_waiting());
    assert!(
        masked(&mut c).is_empty(),
        "nothing is masked before the trigger"
    );
    feed(&mut c, &["a", "x", " ", "<", "x"]).unwrap();
    assert!(
        c.allows(id("</s>")),
        "end of generation is free before the trigger"
    );
    assert!(c.is_waiting());
    feed(&mut c, &["<call>"]).unwrap();
    assert!(!c.is_waiting());
    assert!(!c.allows(id("x")));
    assert!(c.allows(id("{")));
    assert!(masked(&mut c).contains(&"x"));
    feed(&mut c, &["{", "a", "b"]).unwrap();
    assert!(!c.allows(id("</s>")), "the call is not finished");
    feed(&mut c, &["}"]).unwrap();
    assert!(c.allows(id("</s>")));
}

/// A trigger split over tokens, and a token that runs past it: the grammar is given the
/// text from where the word starts, including what followed it in the same token.
#[test]
fn trigger_across_tokens_replays_the_rest() {
    let mut c = constraint(CALL, &[Trigger::Word("<call>".into())]);
    feed(&mut c, &["hello", " ", "<ca"]).unwrap();
    assert!(c.is_waiting());
    feed(&mut c, &["ll>{"]).unwrap();
    assert!(!c.is_waiting());
    // "{" was consumed with the trigger: the next must be a letter or "}".
    assert!(!c.allows(id("{")));
    assert!(c.allows(id("a")));
    assert!(c.allows(id("}")));
}

/// Text after the trigger that breaks the grammar is an error, as a token the grammar
/// rejects is.
#[test]
fn triggered_text_must_fit() {
    let mut c = constraint(CALL, &[Trigger::Word("<ca".into())]);
    feed(&mut c, &["x"]).unwrap();
    assert!(feed(&mut c, &["<ca"]).is_ok());
    assert!(feed(&mut c, &["x"]).is_err());
}

/// A pattern found anywhere starts the grammar at its first capture group; a full pattern
/// must match the whole output so far.
#[test]
fn patterns_anywhere_and_full() {
    let grammar = r#"root ::= "{" [abc]* "}""#;
    let mut c = constraint(grammar, &[Trigger::Pattern(r"x+ *(\{)".into())]);
    feed(&mut c, &["a", "x", " "]).unwrap();
    assert!(c.is_waiting());
    feed(&mut c, &["{"]).unwrap();
    assert!(!c.is_waiting());
    assert!(c.allows(id("a")) && !c.allows(id("{")));

    // Without a group the grammar takes the whole match (here with its leading space,
    // which it rejects); with one, from the group.
    let mut whole = constraint(grammar, &[Trigger::PatternFull(r"\s*\{".into())]);
    feed(&mut whole, &[" "]).unwrap();
    assert!(feed(&mut whole, &["{"]).is_err());
    let full_pattern = Trigger::PatternFull(r"\s*(\{)".into());
    let mut full = constraint(grammar, &[full_pattern.clone()]);
    feed(&mut full, &["a", "{"]).unwrap();
    assert!(
        full.is_waiting(),
        "the full pattern needs the output to start with it"
    );
    let mut full = constraint(grammar, &[full_pattern]);
    feed(&mut full, &[" ", "{"]).unwrap();
    assert!(!full.is_waiting());
    assert!(full.allows(id("b")));
}

#[test]
fn token_trigger_and_non_lazy() {
    let mut c = constraint(CALL, &[Trigger::Token(id("<call>"))]);
    feed(&mut c, &["<", "x"]).unwrap();
    assert!(c.is_waiting());
    feed(&mut c, &["<call>"]).unwrap();
    assert!(!c.is_waiting() && c.allows(id("{")));
    // Without triggers the grammar holds from the start.
    let mut eager = constraint(CALL, &[]);
    assert!(!eager.is_waiting());
    assert!(!eager.allows(id("a")));
    assert!(Triggers::new(&[Trigger::Pattern("(".into())]).is_err());
}
