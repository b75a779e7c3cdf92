//! `--reasoning-budget`, as llama.cpp's reasoning budget sampler has it (`common/sampling.cpp`,
//! `reasoning_budget_tokens`): once the model is thinking — the prompt opened `<think>`, or
//! the model wrote it — it may write `n` tokens of thought; then the tokens that close the
//! thought (`</think>`) are forced and generation goes on freely. A budget of 0 closes the
//! thought at once. A thought the model closes itself ends the count.

use crate::tokenizer::TokenId;

/// A budget for one generation (module doc).
#[derive(Clone, Debug)]
pub struct ReasoningBudget {
    /// Tokens of thought allowed.
    pub n: usize,
    /// The tokens that close a thought (`</think>` tokenized with special tokens).
    pub end: Vec<TokenId>,
    /// The generation starts inside a thought (the prompt ends with `<think>`).
    pub forced_open: bool,
}

/// Where a generation is with its budget.
#[derive(Clone, Debug)]
pub struct BudgetState {
    budget: ReasoningBudget,
    phase: Phase,
    /// The last pieces generated (special tokens rendered), to find the tags in.
    recent: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Not thinking yet.
    Idle,
    /// Thinking: tokens of thought so far.
    Thinking(usize),
    /// Closing: the next of the end tokens to force.
    Forcing(usize),
    /// The thought is closed.
    Done,
}

impl BudgetState {
    /// The state at the start of a generation.
    pub fn new(budget: ReasoningBudget) -> BudgetState {
        let phase = if budget.forced_open {
            Phase::Thinking(0)
        } else {
            Phase::Idle
        };
        let mut s = BudgetState {
            budget,
            phase,
            recent: String::new(),
        };
        s.check_spent();
        s
    }

    /// The token to emit instead of sampling, while the thought is being closed.
    pub fn forced(&self) -> Option<TokenId> {
        match self.phase {
            Phase::Forcing(i) => self.budget.end.get(i).copied(),
            _ => None,
        }
    }

    /// Records the generated token `id` whose text (special tokens rendered) is `piece`.
    pub fn accept(&mut self, piece: &str) {
        self.recent.push_str(piece);
        if self.recent.len() > 64 {
            let mut cut = self.recent.len() - 32;
            while !self.recent.is_char_boundary(cut) {
                cut += 1;
            }
            self.recent.drain(..cut);
        }
        self.phase = match self.phase {
            Phase::Idle if self.recent.contains(crate::chat::reply::THINK_START) => {
                self.recent.clear();
                Phase::Thinking(0)
            }
            Phase::Thinking(_) if self.recent.contains(crate::chat::reply::THINK_END) => {
                Phase::Done
            }
            Phase::Thinking(n) => Phase::Thinking(n + 1),
            Phase::Forcing(i) if i + 1 >= self.budget.end.len() => Phase::Done,
            Phase::Forcing(i) => Phase::Forcing(i + 1),
            other => other,
        };
        self.check_spent();
    }

    fn check_spent(&mut self) {
        if let Phase::Thinking(n) = self.phase {
            if n >= self.budget.n {
                self.phase = if self.budget.end.is_empty() {
                    Phase::Done
                } else {
                    Phase::Forcing(0)
                };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn closes_after_n_tokens_of_thought() {
        let b = ReasoningBudget {
            n: 2,
            end: vec![7, 8],
            forced_open: false,
        };
        let mut s = BudgetState::new(b.clone());
        s.accept("Hi ");
        assert_eq!(s.forced(), None);
        s.accept("<think>");
        s.accept("a");
        assert_eq!(s.forced(), None);
        s.accept("b");
        assert_eq!(s.forced(), Some(7));
        s.accept("</");
        assert_eq!(s.forced(), Some(8));
        s.accept("think>");
        assert_eq!(s.forced(), None);
        s.accept("more");
        assert_eq!(s.forced(), None);
        // Budget 0 with the prompt's thought open: closed at once.
        let s = BudgetState::new(ReasoningBudget {
            n: 0,
            forced_open: true,
            ..b.clone()
        });
        assert_eq!(s.forced(), Some(7));
        // A thought closed by the model ends the count.
        let mut s = BudgetState::new(ReasoningBudget {
            n: 3,
            forced_open: true,
            ..b
        });
        s.accept("x</think>");
        s.accept("y");
        s.accept("z");
        s.accept("w");
        assert_eq!(s.forced(), None);
    }
}
