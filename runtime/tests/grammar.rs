//! Grammar-constrained sampling (`runtime::grammar`): the GBNF reader (llama.cpp's syntax,
//! errors with line and column, every grammar of llama.cpp's `grammars/` folder), the
//! matcher (strings that must and must not match, in the style of llama.cpp's
//! `tests/test-grammar-integration.cpp`; token masks with split UTF-8 and end-of-generation),
//! and the JSON schema converter against llama.cpp's own expected grammars
//! (`tests/test-json-schema-to-grammar.cpp`, its cases as data in
//! `data/json_schema_to_grammar_llama_cpp.json`).

use runtime::grammar::json_schema::to_grammar;
use runtime::grammar::{Grammar, Matcher, Rules, TokenTable};
use std::sync::Arc;

fn rules(text: &str, table: TokenTable) -> Arc<Rules> {
    let g = Grammar::parse(text, None).unwrap_or_else(|e| panic!("{e}\n{text}"));
    Arc::new(Rules::new(&g, Arc::new(table)))
}

fn empty_table() -> TokenTable {
    TokenTable::from_pieces(Vec::new())
}

/// Whether `s` matches the whole grammar (llama.cpp's `match_string`).
fn matches(r: &Arc<Rules>, s: &str) -> bool {
    let mut m = Matcher::new(Arc::clone(r));
    for ch in s.chars() {
        if !m.accept_str(ch.encode_utf8(&mut [0; 4])) {
            return false;
        }
    }
    m.can_end()
}

fn check(grammar: &str, pass: &[&str], fail: &[&str]) {
    let r = rules(grammar, empty_table());
    for s in pass {
        assert!(matches(&r, s), "{s:?} should match {grammar}");
    }
    for s in fail {
        assert!(!matches(&r, s), "{s:?} should not match {grammar}");
    }
}

#[test]
fn strings_match_as_in_llama_cpp() {
    check(r#"root ::= "abc""#, &["abc"], &["", "ab", "abcd", "abd"]);
    check(
        r#"root ::= [a-z]+ ("," [a-z]+)*"#,
        &["a", "ab,c", "x,y,zz"],
        &["", ",", "a,", "A", "a,,b"],
    );
    check(
        r#"root ::= [^0-9\n]* [0-9]"#,
        &["7", "abc7", "é5"],
        &["", "a", "\n5", "55a"],
    );
    check(r#"root ::= "a"{5,5}"#, &["aaaaa"], &["aaaa", "aaaaaa"]);
    check(r#"root ::= "a"{2,}"#, &["aa", "aaaaaaa"], &["a"]);
    check(
        r#"root ::= "a"{0,3} "b""#,
        &["b", "ab", "aaab"],
        &["aaaab", "a"],
    );
    check(
        r#"root ::= ("ab" | "c")? "d""#,
        &["d", "abd", "cd"],
        &["ad", "abcd"],
    );
    check(
        r#"root ::= . "x""#,
        &["ax", "éx", "\u{1F600}x"],
        &["x", "axx"],
    );
    check(
        "# comment\nroot ::= item+ # trailing\nitem ::= \"\\x41\" | [\\u00e9] | \"\\n\"\n",
        &["A", "é\nA"],
        &["", "B"],
    );
    // Right recursion and nesting.
    check(
        r#"root ::= "(" root ")" | """#,
        &["", "()", "((()))"],
        &["(", "(()", "())"],
    );
    // Alternatives with a shared prefix keep both stacks alive.
    check(
        r#"root ::= "foo" "bar" | "foo" "baz""#,
        &["foobar", "foobaz"],
        &["foobat", "foo"],
    );
}

#[test]
fn every_grammar_of_llama_cpp_parses() {
    let dir = std::env::var_os("MODELC_LLAMA_CPP")
        .map(|d| std::path::PathBuf::from(d).join("grammars"))
        .filter(|d| d.is_dir())
        .or_else(|| {
            std::env::var_os("HOME")
                .map(|h| std::path::PathBuf::from(h).join(".cache/modelc/llama.cpp-grammars"))
        })
        .unwrap_or_default();
    let Some(dir) = modelc_tests::require(
        dir,
        "set MODELC_LLAMA_CPP to a llama.cpp source folder or run scripts/fetch-llama-vocab",
    ) else {
        return;
    };
    let mut n = 0;
    for e in std::fs::read_dir(&dir).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "gbnf") {
            let text = std::fs::read_to_string(&p).unwrap();
            if let Err(e) = Grammar::parse(&text, None) {
                panic!("{}: {e}", p.display());
            }
            n += 1;
        }
    }
    assert!(n >= 5, "only {n} grammars in {}", dir.display());
    // A few texts each grammar must accept.
    let json = std::fs::read_to_string(dir.join("json.gbnf")).unwrap();
    let r = rules(&json, empty_table());
    assert!(matches(
        &r,
        r#"{"a": [1, 2.5e3, "x\n"], "b": {"c": null}}"#.replace("\n", "\\n").as_str()
    ));
    assert!(!matches(&r, r#"{"a": }"#));
    let arith = std::fs::read_to_string(dir.join("arithmetic.gbnf")).unwrap();
    let r = rules(&arith, empty_table());
    assert!(matches(&r, "1+2*(3-x)= 7\n"));
    assert!(!matches(&r, "1+2*(3-x)\n"));
}

fn err(text: &str) -> String {
    match Grammar::parse(text, None) {
        Ok(_) => panic!("{text:?} should be refused"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn bad_grammars_are_one_line_errors_with_a_place() {
    assert_eq!(
        err("root ::= a\na ::= b c\nb ::= \"x\""),
        "grammar, line 2, column 9: undefined rule 'c'"
    );
    assert_eq!(err("foo ::= \"x\""), "grammar: there is no 'root' rule");
    assert_eq!(
        err("root ::= expr\nexpr ::= expr \"+\" term | term\nterm ::= [0-9]"),
        "grammar, line 2, column 1: rule 'expr' is left-recursive (llama.cpp's grammars do not support it)"
    );
    // The server suite's invalid grammar.
    let e = err("root ::= this is (not valid GBNF");
    assert!(e.starts_with("grammar, line 1, column "), "{e}");
    assert!(e.contains("expecting ')'"), "{e}");
    for bad in [
        "root ::= \"abc",
        "root ::= [a-z",
        "root ::= \"\\q\"",
        "root ::= *",
        "root ::= \"a\"{3,1}",
        "root ::= \"a\"{5000}",
        "root := \"a\"",
        "root ::= \"a\" )",
        "root ::= <[99999999999]>",
        "root ::= <hello>",
        "root ::= \"\\x4\"",
        &format!(
            "root ::= {}\"a\"{}",
            "(".repeat(100_000),
            ")".repeat(100_000)
        ),
    ] {
        let e = err(bad);
        assert!(
            e.starts_with("grammar") && !e.contains('\n'),
            "{bad:?}: {e}"
        );
    }
}

#[test]
fn rules_are_rewritten_as_llama_cpp_prints_them() {
    let g = Grammar::parse("root ::= \"a\"{2,3} [b-d^x]* . <[7]>", None).unwrap();
    assert_eq!(
        g.to_string(),
        "root ::= [a] [a] root_1 root_2 .] <[7]> \n\
         root_1 ::= [a] | \n\
         root_2 ::= [b-d^x] root_2 | \n"
    );
}

/// A small vocabulary: pieces by id, the last one end-of-generation.
fn table(pieces: &[&[u8]]) -> TokenTable {
    let n = pieces.len();
    TokenTable::from_pieces(
        pieces
            .iter()
            .enumerate()
            .map(|(i, p)| (p.to_vec(), i + 1 == n)),
    )
}

fn allowed(m: &mut Matcher, n: usize) -> Vec<u32> {
    let mut logits = vec![0.0f32; n];
    m.apply(&mut logits);
    let mask: Vec<u32> = (0..n as u32)
        .filter(|&i| logits[i as usize] == 0.0)
        .collect();
    for id in 0..n as u32 {
        assert_eq!(
            m.allows(id),
            mask.contains(&id),
            "allows({id}) disagrees with apply"
        );
    }
    mask
}

#[test]
fn token_masks_follow_the_grammar_across_split_characters() {
    let e = "é".as_bytes();
    let pieces: Vec<&[u8]> = vec![
        b"a",           // 0
        b"ab",          // 1
        b"b",           // 2
        &e[..1],        // 3: first byte of é
        &e[1..],        // 4: its second byte
        "é".as_bytes(), // 5
        b"",            // 6: empty: never
        b"\xff",        // 7: invalid UTF-8
        b"</s>",        // 8: end of generation
    ];
    let n = pieces.len();
    let r = rules(r#"root ::= "a" "é"? "b""#, table(&pieces));
    let mut m = Matcher::new(r);
    assert_eq!(allowed(&mut m, n), vec![0, 1]);
    m.accept(0).unwrap();
    assert_eq!(allowed(&mut m, n), vec![2, 3, 5]);
    m.accept(3).unwrap();
    // Mid-character: only the continuation byte.
    assert_eq!(allowed(&mut m, n), vec![4]);
    m.accept(4).unwrap();
    assert_eq!(allowed(&mut m, n), vec![2]);
    assert!(
        m.accept(0).is_err(),
        "a token the grammar rejects is an error"
    );
    m.accept(2).unwrap();
    // The grammar is complete: only end of generation.
    assert_eq!(allowed(&mut m, n), vec![8]);
    m.accept(8).unwrap();
}

#[test]
fn token_references_match_ids() {
    let pieces: Vec<&[u8]> = vec![b"x", b"y", b"<tool>", b"</s>"];
    let r = rules("root ::= <[2]> !<[0]> \"x\"", table(&pieces));
    let mut m = Matcher::new(r);
    assert_eq!(allowed(&mut m, 4), vec![2]);
    m.accept(2).unwrap();
    assert_eq!(allowed(&mut m, 4), vec![1, 2]);
    m.accept(1).unwrap();
    assert_eq!(allowed(&mut m, 4), vec![0]);
}

#[derive(serde::Deserialize)]
struct SchemaCase {
    name: String,
    status: String,
    schema: String,
    grammar: String,
}

fn trim(s: &str) -> String {
    s.trim()
        .lines()
        .map(str::trim_start)
        .collect::<Vec<_>>()
        .join("\n")
}

/// llama.cpp's JSON-schema cases: the same grammar text (after llama.cpp's own trimming),
/// and every expected grammar parses.
#[test]
fn json_schemas_convert_as_in_llama_cpp() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/json_schema_to_grammar_llama_cpp.json"
    );
    let cases: Vec<SchemaCase> =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let mut bad = Vec::new();
    for c in &cases {
        let got = serde_json::from_str::<serde_json::Value>(&c.schema)
            .map_err(|e| e.to_string())
            .and_then(|v| to_grammar(&v));
        match (c.status.as_str(), got) {
            ("success", Ok(g)) => {
                if trim(&g) != trim(&c.grammar) {
                    bad.push(format!(
                        "{}:\n--- expected\n{}\n--- got\n{}",
                        c.name,
                        trim(&c.grammar),
                        trim(&g)
                    ));
                }
                if let Err(e) = Grammar::parse(&g, None) {
                    bad.push(format!("{}: the grammar does not parse: {e}", c.name));
                }
            }
            ("failure", Err(_)) => {}
            (want, got) => bad.push(format!("{}: expected {want}, got {got:?}", c.name)),
        }
    }
    assert!(
        bad.is_empty(),
        "{} of {} cases differ:\n{}",
        bad.len(),
        cases.len(),
        bad.join("\n\n")
    );
}

#[test]
fn schemas_constrain_what_matches() {
    let cases: &[(&str, &[&str], &[&str])] = &[
        (
            r#"{"type": "integer", "minimum": 5, "maximum": 30}"#,
            &["5", "10", "30"],
            &["05", "4", "-1", "31", "123", "0123"],
        ),
        (
            r#"{"type": "integer", "minimum": -123}"#,
            &["-123", "-1", "0", "1234"],
            &["-1234", "-124"],
        ),
        (r#"{"const": "42"}"#, &["\"42\""], &["42", "\"43\""]),
        (
            r#"{"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "integer"}}, "required": ["a"], "additionalProperties": false}"#,
            &[r#"{"a": "x"}"#, r#"{"a": "x", "b": 3}"#],
            &[r#"{"b": 3}"#, r#"{"a": 1}"#, r#"{"a": "x", "c": 1}"#],
        ),
        (
            r#"{"type": "array", "items": {"type": "boolean"}, "minItems": 1, "maxItems": 2}"#,
            &["[true]", "[true, false]"],
            &["[]", "[true, true, true]"],
        ),
        (
            r#"{"type": "string", "pattern": "^[a-c]{2}(x|yz)?$"}"#,
            &["\"ab\"", "\"abx\"", "\"ccyz\""],
            &["\"a\"", "\"abz\""],
        ),
    ];
    for (schema, pass, fail) in cases {
        let g = to_grammar(&serde_json::from_str(schema).unwrap()).unwrap();
        check(&g, pass, fail);
    }
}

#[test]
fn unsupported_patterns_accept_any_string_as_in_llama_cpp() {
    for p in [
        "^(?=a)a$".to_string(),
        r"^\d+$".to_string(),
        format!("^{}a{}$", "(".repeat(100_000), ")".repeat(100_000)),
    ] {
        let schema = serde_json::json!({"type": "string", "pattern": p});
        let g = to_grammar(&schema).unwrap();
        check(&g, &["\"anything\""], &["1"]);
    }
}

#[test]
fn bad_schemas_are_refused() {
    for s in [
        "123",
        r#"{"type": 123}"#,
        r#"{"type": "hiccup"}"#,
        r##"{"$ref": "https://example.com/x"}"##,
        r##"{"$ref": "#/$defs/missing"}"##,
        r#"{"type": "string", "pattern": "^(a$"}"#,
        r#"{"type": "array", "minItems": -1}"#,
        &format!(
            r#"{{"properties": {{"{}": {{}}}}, "additionalProperties": true}}"#,
            "k".repeat(100_000)
        ),
    ] {
        let e = to_grammar(&serde_json::from_str(s).unwrap());
        assert!(e.is_err(), "{s} should be refused");
    }
}
