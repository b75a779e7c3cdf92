//! The vocabulary as the grammar sees it, decoded once: each token's piece (with special
//! tokens rendered, as llama.cpp's `token_to_piece` cache), its code points from a fresh
//! start, and whether it ends generation. Matching a step then reads code points instead of
//! decoding 49k pieces again.

use super::utf8::{decode, Partial};
use crate::tokenizer::{TokenId, Vocab};
use std::sync::{Arc, Mutex};

/// How the grammar treats a token (llama.cpp `llama_grammar_apply_impl`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// An end-of-generation token: allowed only where the grammar may end.
    Eog,
    /// An empty piece or one starting with NUL: never allowed.
    Never,
    /// Text matched against the grammar.
    Text,
}

/// Every token's piece, code points and [`Kind`] (module doc).
#[derive(Debug)]
pub struct TokenTable {
    pieces: Vec<Box<[u8]>>,
    kinds: Vec<Kind>,
    /// Code points of all tokens decoded from a fresh start, back to back.
    cps: Vec<u32>,
    /// Token `i`'s code points are `cps[ends[i-1]..ends[i]]`.
    ends: Vec<u32>,
    /// The UTF-8 state after each token's piece (from a fresh start).
    tails: Vec<Partial>,
    /// Text tokens with at least one code point, ordered by their first code point.
    by_first: Vec<TokenId>,
    /// Runs of `by_first` sharing a first code point: `(code point, start, end)`.
    groups: Vec<(u32, u32, u32)>,
    /// Text tokens without a whole code point (a piece inside one character, or invalid).
    no_code_point: Vec<TokenId>,
    /// The Text tokens' code points as a trie (node 0 is the root).
    trie: Vec<TrieNode>,
    /// Trie edges `(code point, child)`, each node's run sorted by code point.
    edges: Vec<(u32, u32)>,
    /// Tokens ending at trie nodes, each node's run contiguous.
    ending: Vec<TokenId>,
}

/// A trie node: its edges `edges[edge_start..edge_end]` and the tokens whose code points end
/// here `ending[end_start..end_end]`.
#[derive(Clone, Copy, Debug, Default)]
pub struct TrieNode {
    /// First edge.
    pub edge_start: u32,
    /// One past the last edge.
    pub edge_end: u32,
    /// First token ending here.
    pub end_start: u32,
    /// One past the last token ending here.
    pub end_end: u32,
}

impl TokenTable {
    /// The table of `vocab` (pieces with special tokens rendered).
    pub fn new(vocab: &Vocab) -> TokenTable {
        let n = vocab.n_vocab() as TokenId;
        TokenTable::from_pieces(
            (0..n).map(|id| (vocab.token_to_piece(id, true).to_vec(), vocab.is_eog(id))),
        )
    }

    /// The table of `vocab`, built once and kept while the vocabulary lives (the last
    /// vocabulary asked for is remembered, by address): a server's requests share it.
    pub fn shared(vocab: &Vocab) -> Arc<TokenTable> {
        static LAST: Mutex<Option<(usize, usize, Arc<TokenTable>)>> = Mutex::new(None);
        let key = (std::ptr::from_ref(vocab) as usize, vocab.n_vocab());
        let mut last = LAST.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((addr, n, t)) = last.as_ref() {
            if (*addr, *n) == key && t.fingerprint_matches(vocab) {
                return Arc::clone(t);
            }
        }
        let t = Arc::new(TokenTable::new(vocab));
        *last = Some((key.0, key.1, Arc::clone(&t)));
        t
    }

    /// Whether this table still describes `vocab` (a vocabulary freed and another allocated
    /// at the same address must not reuse it): a few pieces compared.
    fn fingerprint_matches(&self, vocab: &Vocab) -> bool {
        let n = self.len();
        [0, n / 3, n / 2, n.saturating_sub(1)]
            .into_iter()
            .filter(|&i| i < n)
            .all(|i| self.piece(i as TokenId) == vocab.token_to_piece(i as TokenId, true))
    }

    /// A table from `(piece, is_eog)` pairs in id order (tests, small vocabularies).
    pub fn from_pieces(pieces: impl IntoIterator<Item = (Vec<u8>, bool)>) -> TokenTable {
        let mut t = TokenTable {
            pieces: Vec::new(),
            kinds: Vec::new(),
            cps: Vec::new(),
            ends: Vec::new(),
            tails: Vec::new(),
            by_first: Vec::new(),
            groups: Vec::new(),
            no_code_point: Vec::new(),
            trie: Vec::new(),
            edges: Vec::new(),
            ending: Vec::new(),
        };
        for (piece, eog) in pieces {
            let kind = if eog {
                Kind::Eog
            } else if piece.first().is_none_or(|&b| b == 0) {
                Kind::Never
            } else {
                Kind::Text
            };
            let tail = if kind == Kind::Text {
                decode(&piece, Partial::default(), &mut t.cps)
            } else {
                Partial::default()
            };
            t.ends.push(t.cps.len() as u32);
            t.tails.push(tail);
            t.kinds.push(kind);
            t.pieces.push(piece.into_boxed_slice());
        }
        let mut firsts: Vec<(u32, TokenId)> = Vec::new();
        for id in 0..t.kinds.len() as TokenId {
            if t.kind(id) != Kind::Text {
                continue;
            }
            let (at, end, _) = t.span(id);
            if at < end {
                firsts.push((t.cps[at as usize], id));
            } else {
                t.no_code_point.push(id);
            }
        }
        firsts.sort_unstable();
        for (i, &(cp, id)) in firsts.iter().enumerate() {
            match t.groups.last_mut() {
                Some(g) if g.0 == cp => g.2 = i as u32 + 1,
                _ => t.groups.push((cp, i as u32, i as u32 + 1)),
            }
            t.by_first.push(id);
        }
        t.build_trie();
        t
    }

    /// Builds the trie of the Text tokens with at least one code point (sorted by code
    /// points, so each node's edges and tokens come out contiguous and ordered).
    fn build_trie(&mut self) {
        let mut ids: Vec<TokenId> = (0..self.kinds.len() as TokenId)
            .filter(|&id| self.kind(id) == Kind::Text)
            .filter(|&id| {
                let (a, b, _) = self.span(id);
                a < b
            })
            .collect();
        let cps = &self.cps;
        let ends = &self.ends;
        let seq = |id: TokenId| -> &[u32] {
            let i = id as usize;
            let b = ends[i] as usize;
            let a = if i == 0 { 0 } else { ends[i - 1] as usize };
            &cps[a..b]
        };
        ids.sort_by(|&x, &y| seq(x).cmp(seq(y)).then(x.cmp(&y)));
        // Nodes are created depth-first along the sorted tokens; children of a node are
        // linked afterwards.
        #[derive(Default)]
        struct Tmp {
            children: Vec<(u32, u32)>,
            ending: Vec<TokenId>,
        }
        let mut tmp: Vec<Tmp> = vec![Tmp::default()];
        let mut path: Vec<u32> = vec![0];
        let mut prev: &[u32] = &[];
        for &id in &ids {
            let s = seq(id);
            let common = prev.iter().zip(s).take_while(|(a, b)| a == b).count();
            path.truncate(common + 1);
            for &c in &s[common..] {
                let parent = *path.last().unwrap_or(&0);
                let node = tmp.len() as u32;
                tmp.push(Tmp::default());
                tmp[parent as usize].children.push((c, node));
                path.push(node);
            }
            let at = *path.last().unwrap_or(&0);
            tmp[at as usize].ending.push(id);
            prev = s;
        }
        let mut trie = Vec::with_capacity(tmp.len());
        let mut edges = Vec::new();
        let mut ending = Vec::new();
        for n in tmp {
            let e0 = edges.len() as u32;
            edges.extend(n.children);
            let t0 = ending.len() as u32;
            ending.extend(n.ending);
            trie.push(TrieNode {
                edge_start: e0,
                edge_end: edges.len() as u32,
                end_start: t0,
                end_end: ending.len() as u32,
            });
        }
        self.trie = trie;
        self.edges = edges;
        self.ending = ending;
    }

    /// Trie node `n` (the root is 0).
    pub fn node(&self, n: u32) -> TrieNode {
        self.trie.get(n as usize).copied().unwrap_or_default()
    }

    /// The edges `(code point, child)` of `node`.
    pub fn edges(&self, node: TrieNode) -> &[(u32, u32)] {
        self.edges
            .get(node.edge_start as usize..node.edge_end as usize)
            .unwrap_or(&[])
    }

    /// The tokens whose code points end at `node`.
    pub fn ending(&self, node: TrieNode) -> &[TokenId] {
        self.ending
            .get(node.end_start as usize..node.end_end as usize)
            .unwrap_or(&[])
    }

    /// Text tokens grouped by first code point: `(code point, tokens)`, ascending.
    pub fn groups(&self) -> impl Iterator<Item = (u32, &[TokenId])> + '_ {
        self.groups
            .iter()
            .map(|&(cp, a, b)| (cp, &self.by_first[a as usize..b as usize]))
    }

    /// Text tokens whose piece holds no whole code point.
    pub fn without_code_points(&self) -> &[TokenId] {
        &self.no_code_point
    }

    /// Number of tokens.
    pub fn len(&self) -> usize {
        self.kinds.len()
    }

    /// Whether the table has no tokens.
    pub fn is_empty(&self) -> bool {
        self.kinds.is_empty()
    }

    /// How the grammar treats token `id` (`Never` outside the table).
    pub fn kind(&self, id: TokenId) -> Kind {
        self.kinds.get(id as usize).copied().unwrap_or(Kind::Never)
    }

    /// Token `id`'s piece (empty outside the table).
    pub fn piece(&self, id: TokenId) -> &[u8] {
        self.pieces.get(id as usize).map_or(&[], |p| p)
    }

    /// All decoded code points; a token's span is [`TokenTable::span`].
    pub fn code_points(&self) -> &[u32] {
        &self.cps
    }

    /// Token `id`'s code points as a range of [`TokenTable::code_points`], and the UTF-8
    /// state after them (from a fresh start).
    pub fn span(&self, id: TokenId) -> (u32, u32, Partial) {
        let i = id as usize;
        let end = self.ends.get(i).copied().unwrap_or(0);
        let start = if i == 0 {
            0
        } else {
            self.ends.get(i - 1).copied().unwrap_or(end)
        };
        (start, end, self.tails.get(i).copied().unwrap_or_default())
    }
}
