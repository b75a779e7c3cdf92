//! Matching text against a grammar with llama.cpp's semantics (`src/llama-grammar.cpp`):
//! a set of pushdown stacks over the rules' elements, each stack's top a terminal (a char
//! class or a token element); accepting a code point advances every stack whose top matches
//! it and expands rule references again. A token is allowed when its code points can be
//! consumed by at least one stack (a piece may end inside a UTF-8 character if some
//! continuation could match); an end-of-generation token only when a stack is empty (the
//! grammar may end here).
//!
//! [`Matcher::apply`] sets the logits of rejected tokens to `-inf`, as llama.cpp's grammar
//! sampler does; it filters all candidates together, stack by stack and code point by code
//! point (llama.cpp's `llama_grammar_reject_candidates`), so most tokens are dropped at their
//! first code point and the rest share the deeper work.

use super::parse::{Elem, Grammar};
use super::tokens::{Kind, TokenTable};
use super::utf8::{decode, Partial};
use crate::tokenizer::TokenId;
use rustc_hash::{FxHashMap, FxHashSet};
use std::rc::Rc;
use std::sync::Arc;

/// A stack: positions in [`Rules::elems`], top last.
type Stack = Vec<u32>;

/// Most stacks a matcher keeps: a grammar so ambiguous that more parses stay open at once
/// is refused when generation reaches that point (each step costs time per stack).
pub const MAX_STACKS: usize = 4096;

/// Stacks already expanded during one masking pass.
type Memo = FxHashMap<Stack, Rc<Vec<Stack>>>;

/// A grammar's rules laid out flat for matching, with its starting stacks and the
/// vocabulary's [`TokenTable`]; shared by every generation that uses the grammar.
pub struct Rules {
    elems: Vec<Elem>,
    /// Whether some rule holds a token element (`<[id]>`, `!<[id]>`).
    has_tokens: bool,
    starts: Vec<u32>,
    initial: Vec<Stack>,
    tokens: Arc<TokenTable>,
}

impl std::fmt::Debug for Rules {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Rules({} elements, {} rules, {} start stacks)",
            self.elems.len(),
            self.starts.len(),
            self.initial.len()
        )
    }
}

impl Rules {
    /// The matching form of `grammar` (already checked by [`Grammar::parse`]) over `tokens`.
    pub fn new(grammar: &Grammar, tokens: Arc<TokenTable>) -> Rules {
        let mut elems = Vec::new();
        let mut starts = Vec::with_capacity(grammar.rules.len());
        for r in &grammar.rules {
            starts.push(elems.len() as u32);
            elems.extend_from_slice(r);
            if r.last() != Some(&Elem::End) {
                elems.push(Elem::End);
            }
        }
        let has_tokens = elems
            .iter()
            .any(|e| matches!(e, Elem::Token(_) | Elem::TokenNot(_)));
        let mut rules = Rules {
            has_tokens,
            elems,
            starts,
            initial: Vec::new(),
            tokens,
        };
        let mut initial = Vec::new();
        let mut pos = rules.start(grammar.root);
        loop {
            let stack = if rules.at(pos).ends_alternative() {
                Vec::new()
            } else {
                vec![pos]
            };
            rules.advance(stack, &mut initial);
            while !rules.at(pos).ends_alternative() {
                pos += 1;
            }
            if rules.at(pos) == Elem::Alt {
                pos += 1;
            } else {
                break;
            }
        }
        rules.initial = initial;
        rules
    }

    /// The vocabulary table.
    pub fn tokens(&self) -> &TokenTable {
        &self.tokens
    }

    fn start(&self, rule: u32) -> u32 {
        self.starts.get(rule as usize).copied().unwrap_or(0)
    }

    fn at(&self, pos: u32) -> Elem {
        self.elems.get(pos as usize).copied().unwrap_or(Elem::End)
    }

    /// llama.cpp's `llama_grammar_advance_stack`: expands rule references at the top of
    /// `stack` until every resulting stack is empty or has a terminal on top; adds the new
    /// ones to `out`.
    fn advance(&self, stack: Stack, out: &mut Vec<Stack>) {
        let mut todo = vec![stack];
        let mut seen: FxHashSet<Stack> = FxHashSet::default();
        while let Some(stack) = todo.pop() {
            if seen.contains(&stack) {
                continue;
            }
            let Some(&top) = stack.last() else {
                if !out.contains(&stack) {
                    out.push(stack.clone());
                }
                seen.insert(stack);
                continue;
            };
            match self.at(top) {
                Elem::RuleRef(r) => {
                    let mut sub = self.start(r);
                    loop {
                        let mut next = stack[..stack.len() - 1].to_vec();
                        if !self.at(top + 1).ends_alternative() {
                            next.push(top + 1);
                        }
                        if !self.at(sub).ends_alternative() {
                            next.push(sub);
                        }
                        todo.push(next);
                        while !self.at(sub).ends_alternative() {
                            sub += 1;
                        }
                        if self.at(sub) == Elem::Alt {
                            sub += 1;
                        } else {
                            break;
                        }
                    }
                }
                Elem::Char(_)
                | Elem::CharNot(_)
                | Elem::Any
                | Elem::Token(_)
                | Elem::TokenNot(_) => {
                    if !out.contains(&stack) {
                        out.push(stack.clone());
                    }
                }
                // Never on top of a stack by construction.
                Elem::End | Elem::Alt | Elem::RngUpper(_) | Elem::CharAlt(_) => {}
            }
            seen.insert(stack);
        }
    }

    /// llama.cpp's `llama_grammar_match_char`: whether `c` matches the class at `pos`, and
    /// the position after the class.
    fn match_char(&self, mut pos: u32, c: u32) -> (bool, u32) {
        let first = self.at(pos);
        let positive = matches!(first, Elem::Char(_) | Elem::Any);
        let mut found = false;
        loop {
            let e = self.at(pos);
            if let Elem::RngUpper(hi) = self.at(pos + 1) {
                found = found || (value(e) <= c && c <= hi);
                pos += 2;
            } else if e == Elem::Any {
                found = true;
                pos += 1;
            } else {
                found = found || value(e) == c;
                pos += 1;
            }
            if !matches!(self.at(pos), Elem::CharAlt(_)) {
                break;
            }
        }
        (found == positive, pos)
    }

    /// llama.cpp's `llama_grammar_match_partial_char`: whether some completion of the
    /// unfinished character `p` could match the class at `pos`.
    fn match_partial(&self, mut pos: u32, p: Partial) -> bool {
        let positive = matches!(self.at(pos), Elem::Char(_) | Elem::Any);
        let n = i32::from(p.n_remain);
        if n < 0 || (n == 1 && p.value < 2) {
            return false;
        }
        let mut low = p.value << (n * 6);
        let high = low | ((1u32 << (n * 6)) - 1);
        if low == 0 {
            if n == 2 {
                low = 1 << 11;
            } else if n == 3 {
                low = 1 << 16;
            }
        }
        loop {
            let e = self.at(pos);
            if let Elem::RngUpper(hi) = self.at(pos + 1) {
                if value(e) <= high && low <= hi {
                    return positive;
                }
                pos += 2;
            } else if e == Elem::Any {
                return true;
            } else {
                if low <= value(e) && value(e) <= high {
                    return positive;
                }
                pos += 1;
            }
            if !matches!(self.at(pos), Elem::CharAlt(_)) {
                break;
            }
        }
        !positive
    }

    /// llama.cpp's `llama_grammar_accept_chr`: the stacks `stack` becomes after code point `c`.
    fn accept_char(&self, stack: &Stack, c: u32, out: &mut Vec<Stack>) {
        let Some(&top) = stack.last() else {
            return;
        };
        if matches!(self.at(top), Elem::Token(_) | Elem::TokenNot(_)) {
            return;
        }
        let (ok, after) = self.match_char(top, c);
        if ok {
            let mut next = stack[..stack.len() - 1].to_vec();
            if !self.at(after).ends_alternative() {
                next.push(after);
            }
            self.advance(next, out);
        }
    }

    /// [`Rules::advance`] of `stack` alone, remembered in `memo` for one masking pass
    /// (the same stacks recur at every depth of the candidates' code points).
    fn advance_memo(&self, stack: Stack, memo: &mut Memo) -> Rc<Vec<Stack>> {
        if let Some(r) = memo.get(&stack) {
            return Rc::clone(r);
        }
        let mut out = Vec::new();
        self.advance(stack.clone(), &mut out);
        let r = Rc::new(out);
        memo.insert(stack, Rc::clone(&r));
        r
    }

    /// The candidates no stack of `stacks` accepts (llama.cpp
    /// `llama_grammar_reject_candidates`).
    fn reject(
        &self,
        stacks: &[Stack],
        cands: Vec<Cand>,
        cps: &[u32],
        memo: &mut Memo,
    ) -> Vec<Cand> {
        let Some((first, rest)) = stacks.split_first() else {
            return cands;
        };
        if cands.is_empty() {
            return cands;
        }
        let mut rejects = self.reject_for_stack(first, cands, cps, memo);
        for s in rest {
            if rejects.is_empty() {
                break;
            }
            rejects = self.reject_for_stack(s, rejects, cps, memo);
        }
        rejects
    }

    /// The candidates `stack` does not accept (llama.cpp
    /// `llama_grammar_reject_candidates_for_stack`).
    fn reject_for_stack(
        &self,
        stack: &Stack,
        cands: Vec<Cand>,
        cps: &[u32],
        memo: &mut Memo,
    ) -> Vec<Cand> {
        let mut rejects = Vec::new();
        let Some(&top) = stack.last() else {
            rejects.extend(
                cands
                    .into_iter()
                    .filter(|c| c.at != c.end || c.tail.n_remain != 0),
            );
            return rejects;
        };
        let top_elem = self.at(top);
        if let Elem::Token(_) | Elem::TokenNot(_) = top_elem {
            for c in cands {
                let reject = if c.at == c.end {
                    c.tail.n_remain != 0
                } else {
                    !match_token(top_elem, c.id)
                };
                if reject {
                    rejects.push(c);
                }
            }
            return rejects;
        }
        let mut next = Vec::with_capacity(cands.len());
        for c in cands {
            if c.at == c.end {
                if c.tail.n_remain != 0 && !self.match_partial(top, c.tail) {
                    rejects.push(c);
                }
            } else if self.match_char(top, cps[c.at as usize]).0 {
                next.push(Cand { at: c.at + 1, ..c });
            } else {
                rejects.push(c);
            }
        }
        if next.is_empty() {
            return rejects;
        }
        let after = self.match_char(top, 0).1;
        let mut stack_after = stack[..stack.len() - 1].to_vec();
        if !self.at(after).ends_alternative() {
            stack_after.push(after);
        }
        let next_stacks = self.advance_memo(stack_after, memo);
        for c in self.reject(&next_stacks, next, cps, memo) {
            rejects.push(Cand { at: c.at - 1, ..c });
        }
        rejects
    }
}

/// The state of one walk of the vocabulary trie ([`Matcher::apply_trie`]).
struct TrieWalk<'a> {
    rules: &'a Rules,
    table: &'a TokenTable,
    /// Stack sets met, by id.
    sets: Vec<Rc<Vec<Stack>>>,
    ids: FxHashMap<Vec<Stack>, u32>,
    /// Per set: (mask of its stacks that took a code point, the set reached).
    next: Vec<Vec<(u64, u32)>>,
    memo: Memo,
    accepted: &'a mut Vec<bool>,
    /// A set grew past 64 stacks: the walk gave up.
    overflow: bool,
}

impl TrieWalk<'_> {
    fn visit(&mut self, node: u32, set: u32, depth: usize) {
        if self.overflow || depth > 4096 {
            self.overflow = true;
            return;
        }
        let rules = self.rules;
        let table = self.table;
        let n = table.node(node);
        let stacks = Rc::clone(&self.sets[set as usize]);
        if node != 0 {
            for &id in table.ending(n) {
                let (_, _, tail) = table.span(id);
                let ok = match tail.n_remain {
                    0 => true,
                    r if r > 0 => stacks
                        .iter()
                        .any(|s| s.last().is_some_and(|&top| rules.match_partial(top, tail))),
                    _ => false,
                };
                if ok {
                    if let Some(a) = self.accepted.get_mut(id as usize) {
                        *a = true;
                    }
                }
            }
        }
        for &(cp, child) in table.edges(n) {
            let mut mask = 0u64;
            for (i, s) in stacks.iter().enumerate() {
                if let Some(&top) = s.last() {
                    if rules.match_char(top, cp).0 {
                        mask |= 1 << i;
                    }
                }
            }
            if mask == 0 {
                continue;
            }
            let known = self.next[set as usize]
                .iter()
                .find(|e| e.0 == mask)
                .map(|e| e.1);
            let next = match known {
                Some(id) => id,
                None => {
                    let id = self.step(&stacks, mask);
                    self.next[set as usize].push((mask, id));
                    id
                }
            };
            if self.sets[next as usize].is_empty() {
                continue;
            }
            self.visit(child, next, depth + 1);
        }
    }

    /// The set reached from the stacks of `stacks` selected by `mask` taking a code point.
    fn step(&mut self, stacks: &[Stack], mask: u64) -> u32 {
        let mut out: Vec<Stack> = Vec::new();
        for (i, s) in stacks.iter().enumerate() {
            if mask & (1 << i) == 0 {
                continue;
            }
            let Some(&top) = s.last() else { continue };
            let after = self.rules.match_char(top, 0).1;
            let mut st = s[..s.len() - 1].to_vec();
            if !self.rules.at(after).ends_alternative() {
                st.push(after);
            }
            for x in self.rules.advance_memo(st, &mut self.memo).iter() {
                if !out.contains(x) {
                    out.push(x.clone());
                }
            }
        }
        if out.len() > 64 {
            self.overflow = true;
        }
        if let Some(&id) = self.ids.get(&out) {
            return id;
        }
        let id = self.sets.len() as u32;
        self.ids.insert(out.clone(), id);
        self.sets.push(Rc::new(out));
        self.next.push(Vec::new());
        id
    }
}

fn value(e: Elem) -> u32 {
    match e {
        Elem::Char(c) | Elem::CharNot(c) | Elem::CharAlt(c) | Elem::RngUpper(c) => c,
        _ => 0,
    }
}

fn match_token(e: Elem, id: u32) -> bool {
    match e {
        Elem::Token(t) => t == id,
        Elem::TokenNot(t) => t != id,
        _ => false,
    }
}

/// A token being matched: its code points `cps[at..end]` still to consume, and the UTF-8
/// state after them.
#[derive(Clone, Copy, Debug)]
struct Cand {
    id: u32,
    at: u32,
    end: u32,
    tail: Partial,
}

/// The state of one generation under a grammar (llama.cpp's `llama_grammar`: stacks and an
/// unfinished UTF-8 character).
#[derive(Clone, Debug)]
pub struct Matcher {
    rules: Arc<Rules>,
    stacks: Vec<Stack>,
    partial: Partial,
    /// Scratch: code points decoded when a character is unfinished.
    scratch: Vec<u32>,
    /// Scratch: which tokens a stack accepted.
    accepted: Vec<bool>,
}

impl Matcher {
    /// A matcher at the grammar's start.
    pub fn new(rules: Arc<Rules>) -> Matcher {
        Matcher {
            stacks: rules.initial.clone(),
            rules,
            partial: Partial::default(),
            scratch: Vec::new(),
            accepted: Vec::new(),
        }
    }

    /// Whether the grammar may end here (a stack is empty): end-of-generation is allowed.
    pub fn can_end(&self) -> bool {
        self.stacks.iter().any(Vec::is_empty)
    }

    /// Whether nothing more can be matched (no stack left).
    pub fn is_dead(&self) -> bool {
        self.stacks.is_empty()
    }

    /// Sets `logits[id]` to `-inf` for every token the grammar rejects here (llama.cpp
    /// `llama_grammar_apply_impl`). `logits` is indexed by token id.
    ///
    /// The same decision as llama.cpp's, reached faster: by a walk of the vocabulary's trie
    /// ([`Matcher::apply_trie`]); for grammars with token elements, stack by stack where
    /// only the tokens whose first code point the stack's top accepts are followed further
    /// (the table groups tokens by first code point) and a token another stack already
    /// accepted is not looked at again; inside an unfinished character, token by token.
    pub fn apply(&mut self, logits: &mut [f32]) {
        let allow_eog = self.can_end();
        let table = Arc::clone(&self.rules.tokens);
        if self.partial.is_pending() {
            return self.apply_each(logits, &table, allow_eog);
        }
        if !self.rules.has_tokens && self.apply_trie(logits, &table, allow_eog) {
            return;
        }
        let n = logits.len();
        let mut accepted = std::mem::take(&mut self.accepted);
        accepted.clear();
        accepted.resize(n, false);
        let cps = table.code_points();
        let rules = Arc::clone(&self.rules);
        let mut memo = Memo::default();
        for stack in &self.stacks {
            let Some(&top) = stack.last() else {
                // An empty stack takes no text.
                continue;
            };
            let e = rules.at(top);
            if let Elem::Token(_) | Elem::TokenNot(_) = e {
                for (_, ids) in table.groups() {
                    for &id in ids {
                        if match_token(e, id) {
                            if let Some(a) = accepted.get_mut(id as usize) {
                                *a = true;
                            }
                        }
                    }
                }
                continue;
            }
            let mut next = Vec::new();
            for (cp, ids) in table.groups() {
                if !rules.match_char(top, cp).0 {
                    continue;
                }
                for &id in ids {
                    if accepted.get(id as usize) == Some(&false) {
                        let (at, end, tail) = table.span(id);
                        next.push(Cand {
                            id,
                            at: at + 1,
                            end,
                            tail,
                        });
                    }
                }
            }
            for &id in table.without_code_points() {
                let (_, _, tail) = table.span(id);
                if tail.n_remain > 0 && rules.match_partial(top, tail) {
                    if let Some(a) = accepted.get_mut(id as usize) {
                        *a = true;
                    }
                }
            }
            if next.is_empty() {
                continue;
            }
            let after = rules.match_char(top, 0).1;
            let mut stack_after = stack[..stack.len() - 1].to_vec();
            if !rules.at(after).ends_alternative() {
                stack_after.push(after);
            }
            let next_stacks = rules.advance_memo(stack_after, &mut memo);
            let mut rejected = vec![false; 0];
            let rejects = rules.reject(&next_stacks, next.clone(), cps, &mut memo);
            if !rejects.is_empty() {
                rejected.resize(n, false);
                for c in &rejects {
                    if let Some(r) = rejected.get_mut(c.id as usize) {
                        *r = true;
                    }
                }
            }
            for c in next {
                if rejected.get(c.id as usize) != Some(&true) {
                    if let Some(a) = accepted.get_mut(c.id as usize) {
                        *a = true;
                    }
                }
            }
        }
        mask(logits, &table, &accepted, allow_eog);
        self.accepted = accepted;
    }

    /// [`Matcher::apply`] over the vocabulary's trie: the stacks are advanced once per trie
    /// edge instead of once per token and code point, and the stack sets reached are
    /// remembered by (set, which stacks took the code point). A token is allowed when the
    /// walk reaches its node with some stack left (and, for a piece ending inside a
    /// character, a stack whose class a completion could match): the existential llama.cpp's
    /// stack-by-stack rejection computes. Grammars with token elements, and more than 64
    /// stacks at a node, take the other path (false).
    fn apply_trie(&mut self, logits: &mut [f32], table: &TokenTable, allow_eog: bool) -> bool {
        if self.stacks.len() > 64 {
            return false;
        }
        let n = logits.len();
        let mut accepted = std::mem::take(&mut self.accepted);
        accepted.clear();
        accepted.resize(n, false);
        let mut walk = TrieWalk {
            rules: &self.rules,
            table,
            sets: vec![Rc::new(self.stacks.clone())],
            ids: FxHashMap::default(),
            next: vec![Vec::new()],
            memo: Memo::default(),
            accepted: &mut accepted,
            overflow: false,
        };
        walk.ids.insert(self.stacks.clone(), 0);
        // Pieces without a whole code point: only a completion of their character counts.
        for &id in table.without_code_points() {
            let (_, _, tail) = table.span(id);
            let ok = tail.n_remain > 0
                && self.stacks.iter().any(|s| {
                    s.last()
                        .is_some_and(|&top| self.rules.match_partial(top, tail))
                });
            if ok {
                if let Some(a) = walk.accepted.get_mut(id as usize) {
                    *a = true;
                }
            }
        }
        walk.visit(0, 0, 0);
        if walk.overflow {
            self.accepted = accepted;
            return false;
        }
        mask(logits, table, &accepted, allow_eog);
        self.accepted = accepted;
        true
    }

    /// [`Matcher::apply`] token by token, as llama.cpp does it (used inside a character).
    fn apply_each(&mut self, logits: &mut [f32], table: &TokenTable, allow_eog: bool) {
        let pending = self.partial.is_pending();
        self.scratch.clear();
        let mut cands = Vec::with_capacity(logits.len());
        for (id, l) in logits.iter_mut().enumerate() {
            let id = id as TokenId;
            if *l == f32::NEG_INFINITY {
                continue;
            }
            match table.kind(id) {
                Kind::Eog => {
                    if !allow_eog {
                        *l = f32::NEG_INFINITY;
                    }
                }
                Kind::Never => *l = f32::NEG_INFINITY,
                Kind::Text => cands.push(self.candidate(table, id, pending)),
            }
        }
        let cps: &[u32] = if pending {
            &self.scratch
        } else {
            table.code_points()
        };
        for c in self
            .rules
            .reject(&self.stacks, cands, cps, &mut Memo::default())
        {
            if let Some(l) = logits.get_mut(c.id as usize) {
                *l = f32::NEG_INFINITY;
            }
        }
    }

    /// Whether the grammar allows token `id` here (what [`Matcher::apply`] would leave).
    pub fn allows(&mut self, id: TokenId) -> bool {
        let table = Arc::clone(&self.rules.tokens);
        match table.kind(id) {
            Kind::Eog => self.can_end(),
            Kind::Never => false,
            Kind::Text => {
                let pending = self.partial.is_pending();
                self.scratch.clear();
                let c = self.candidate(&table, id, pending);
                let cps: &[u32] = if pending {
                    &self.scratch
                } else {
                    table.code_points()
                };
                self.rules
                    .reject(&self.stacks, vec![c], cps, &mut Memo::default())
                    .is_empty()
            }
        }
    }

    fn candidate(&mut self, table: &TokenTable, id: TokenId, pending: bool) -> Cand {
        if pending {
            let at = self.scratch.len() as u32;
            let tail = decode(table.piece(id), self.partial, &mut self.scratch);
            Cand {
                id,
                at,
                end: self.scratch.len() as u32,
                tail,
            }
        } else {
            let (at, end, tail) = table.span(id);
            Cand { id, at, end, tail }
        }
    }

    /// Advances the grammar past token `id` (llama.cpp `llama_grammar_accept_impl`).
    ///
    /// # Errors
    /// The token does not fit the grammar here (nothing was changed then).
    pub fn accept(&mut self, id: TokenId) -> Result<(), String> {
        let table = Arc::clone(&self.rules.tokens);
        match table.kind(id) {
            Kind::Eog if self.can_end() => return Ok(()),
            Kind::Eog => {
                return Err(format!(
                    "end-of-generation token {id} where the grammar cannot end"
                ))
            }
            Kind::Never | Kind::Text => {}
        }
        let mut cps = Vec::new();
        let tail = decode(table.piece(id), self.partial, &mut cps);
        let stacks = self.advance_by(Some(id), &cps);
        if stacks.is_empty() {
            return Err(format!(
                "token {id} ({:?}) does not fit the grammar here",
                String::from_utf8_lossy(table.piece(id))
            ));
        }
        if stacks.len() > MAX_STACKS {
            return Err(format!(
                "the grammar is too ambiguous: {} parses are open at once (at most {MAX_STACKS})",
                stacks.len()
            ));
        }
        self.stacks = stacks;
        self.partial = tail;
        Ok(())
    }

    /// Advances the grammar past the text `s` (no tokens involved); false (and nothing
    /// changed) when the text does not fit. For tests and prefills.
    pub fn accept_str(&mut self, s: &str) -> bool {
        let mut cps = Vec::new();
        let tail = decode(s.as_bytes(), self.partial, &mut cps);
        let stacks = self.advance_by(None, &cps);
        if stacks.is_empty() {
            return false;
        }
        self.stacks = stacks;
        self.partial = tail;
        true
    }

    /// The stacks after consuming token `id` (when a token element may take it) or the code
    /// points `cps` (llama.cpp `llama_grammar_accept_token`).
    fn advance_by(&self, id: Option<TokenId>, cps: &[u32]) -> Vec<Stack> {
        let rules = &self.rules;
        let mut out: Vec<Stack> = Vec::new();
        for stack in &self.stacks {
            let Some(&top) = stack.last() else {
                continue;
            };
            let e = rules.at(top);
            if let Elem::Token(_) | Elem::TokenNot(_) = e {
                if id.is_some_and(|id| match_token(e, id)) {
                    let mut next = stack[..stack.len() - 1].to_vec();
                    if !rules.at(top + 1).ends_alternative() {
                        next.push(top + 1);
                    }
                    rules.advance(next, &mut out);
                }
                continue;
            }
            let mut current = vec![stack.clone()];
            for &c in cps {
                let mut next = Vec::new();
                for s in &current {
                    rules.accept_char(s, c, &mut next);
                }
                current = next;
                if current.is_empty() {
                    break;
                }
            }
            for s in current {
                if !out.contains(&s) {
                    out.push(s);
                }
            }
        }
        out
    }
}

/// Sets to -inf the logits of the tokens a mask pass did not accept: text tokens not in
/// `accepted`, end-of-generation tokens unless `allow_eog`, and every other kind.
fn mask(logits: &mut [f32], table: &TokenTable, accepted: &[bool], allow_eog: bool) {
    for (id, l) in logits.iter_mut().enumerate() {
        match table.kind(id as TokenId) {
            Kind::Eog if allow_eog => {}
            Kind::Text if accepted.get(id) == Some(&true) => {}
            _ => *l = f32::NEG_INFINITY,
        }
    }
}
