//! JSON schema → GBNF, with llama.cpp's semantics and output (`common/json-schema.cpp` reads
//! the schema into a tree, `common/json-schema-to-grammar.cpp` writes the rules): the same
//! rule names, the same rule bodies, the rules sorted by name, so a schema gives llama.cpp's
//! grammar text.
//!
//! Supported: `type` (one or a list), `properties` / `required` / `additionalProperties`,
//! `enum`, `const`, `items` (a schema, or a list: a tuple; `prefixItems`), `minItems` /
//! `maxItems`, `minLength` / `maxLength`, `pattern` (anchored regular expressions: literals,
//! `.`, classes, groups, `|`, `* + ? {m,n}`; anything else accepts any string, as llama.cpp
//! does, with a warning on stderr), `format` (`date`, `time`, `date-time`, `uuid`), `$ref`
//! into the same document (`#/$defs/...`, `#/definitions/...`), `anyOf` / `oneOf` /
//! `allOf`, integer `minimum` / `maximum` / `exclusiveMinimum` / `exclusiveMaximum`.

use serde_json::Value;
use std::collections::{BTreeMap, HashMap, HashSet};

mod node;
mod pattern;

use node::{Format, Node};

/// Longest property name the `additionalProperties` key rule spells out.
const MAX_NAME: usize = 1000;

/// llama.cpp's whitespace rule between JSON tokens.
const SPACE_RULE: &str = r#"| " " | "\n"{1,2} [ \t]{0,20}"#;

/// A built-in rule: its body and the rules it needs.
struct Builtin {
    body: &'static str,
    deps: &'static [&'static str],
}

/// llama.cpp's primitive rules (`PRIMITIVE_RULES`, `STRING_FORMAT_RULES`), by name.
fn builtin(name: &str) -> Option<Builtin> {
    let (body, deps): (&'static str, &'static [&'static str]) = match name {
        "boolean" => (r#"("true" | "false")"#, &[]),
        "decimal-part" => ("[0-9]{1,16}", &[]),
        "integral-part" => ("[0] | [1-9] [0-9]{0,15}", &[]),
        "number" => (
            r#"("-"? integral-part) ("." decimal-part)? ([eE] [-+]? integral-part)?"#,
            &["integral-part", "decimal-part"],
        ),
        "integer" => (r#"("-"? integral-part)"#, &["integral-part"]),
        "value" => (
            "object | array | string | number | boolean | null",
            &["object", "array", "string", "number", "boolean", "null"],
        ),
        "object" => (
            r#""{" space ( string ":" space value ("," space string ":" space value)* )? space "}""#,
            &["string", "value"],
        ),
        "array" => (
            r#""[" space ( value ("," space value)* )? space "]""#,
            &["value"],
        ),
        "uuid" => (
            r#""\"" [0-9a-fA-F]{8} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{12} "\"""#,
            &[],
        ),
        "char" => (
            r#"[^"\\\x7F\x00-\x1F] | [\\] (["\\bfnrt] | "u" [0-9a-fA-F]{4})"#,
            &[],
        ),
        "string" => (r#""\"" char* "\"""#, &["char"]),
        "null" => (r#""null""#, &[]),
        "date" => (
            r#"[0-9]{4} "-" ( "0" [1-9] | "1" [0-2] ) "-" ( "0" [1-9] | [1-2] [0-9] | "3" [0-1] )"#,
            &[],
        ),
        "time" => (
            r#"([01] [0-9] | "2" [0-3]) ":" [0-5] [0-9] ":" [0-5] [0-9] ( "." [0-9]{3} )? ( "Z" | ( "+" | "-" ) ( [01] [0-9] | "2" [0-3] ) ":" [0-5] [0-9] )"#,
            &[],
        ),
        "date-time" => (r#"date "T" time"#, &["date", "time"]),
        "date-string" => (r#""\"" date "\"""#, &["date"]),
        "time-string" => (r#""\"" time "\"""#, &["time"]),
        "date-time-string" => (r#""\"" date-time "\"""#, &["date-time"]),
        _ => return None,
    };
    Some(Builtin { body, deps })
}

/// Names a schema's rule may not take as they are (llama.cpp appends `-`).
fn is_reserved(name: &str) -> bool {
    name == "root" || builtin(name).is_some()
}

/// Replaces every run of characters outside `[a-zA-Z0-9-]` by one `-`.
fn rule_name(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut in_run = false;
    for c in name.chars() {
        if c.is_ascii_alphanumeric() || c == '-' {
            out.push(c);
            in_run = false;
        } else if !in_run {
            out.push('-');
            in_run = true;
        }
    }
    out
}

/// A GBNF literal for `s`: `\r \n " \` escaped, in double quotes.
fn literal(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '\r' => out.push_str("\\r"),
            '\n' => out.push_str("\\n"),
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// The JSON text of `v` as llama.cpp's `dump()` writes it (compact).
fn dump(v: &Value) -> String {
    serde_json::to_string(v).unwrap_or_default()
}

/// A rule for a constant: its JSON text as a literal.
fn constant(v: &Value) -> String {
    literal(&dump(v))
}

/// llama.cpp's `build_repetition`: `item` repeated `min` to `max` times (`None`: no upper
/// bound), separated by `sep` when given.
fn repetition(item: &str, min: u64, max: Option<u64>, sep: &str) -> String {
    if max == Some(0) {
        return String::new();
    }
    if min == 0 && max == Some(1) {
        return format!("{item}?");
    }
    if sep.is_empty() {
        return match (min, max) {
            (1, None) => format!("{item}+"),
            (0, None) => format!("{item}*"),
            (_, Some(m)) => format!("{item}{{{min},{m}}}"),
            (_, None) => format!("{item}{{{min},}}"),
        };
    }
    let inner = repetition(
        &format!("({sep} {item})"),
        min.saturating_sub(1),
        max.map(|m| m - 1),
        "",
    );
    let result = format!("{item} {inner}");
    if min == 0 {
        format!("({result})?")
    } else {
        result
    }
}

/// Converts `schema` to a GBNF grammar whose `root` accepts the JSON it describes
/// (llama.cpp `json_schema_to_grammar`).
///
/// # Errors
/// A schema llama.cpp refuses (not an object, an unknown `type`, a bad `$ref`, a malformed
/// count, an invalid `pattern`), one line naming where.
pub fn to_grammar(schema: &Value) -> Result<String, String> {
    to_rules(schema, "")
}

/// Like [`to_grammar`], with the schema's rule named `name` instead of `root` (its helper
/// rules prefixed with it), so that the rules can be part of a larger grammar (llama.cpp's
/// `common_grammar_builder::add_schema`, which tool-call grammars use). An empty `name`
/// gives `root`.
///
/// # Errors
/// As [`to_grammar`].
pub fn to_rules(schema: &Value, name: &str) -> Result<String, String> {
    let mut refs = BTreeMap::new();
    let root = node::build(schema, &mut refs)
        .map_err(|e| format!("JSON schema conversion failed: {e}"))?;
    let mut c = Converter {
        rules: BTreeMap::new(),
        refs: &refs,
        resolving: HashSet::new(),
        errors: Vec::new(),
        warnings: Vec::new(),
    };
    c.rules.insert("space".into(), SPACE_RULE.into());
    c.visit(&root, name);
    if !c.errors.is_empty() {
        return Err(format!(
            "JSON schema conversion failed: {}",
            c.errors.join("; ")
        ));
    }
    if !c.warnings.is_empty() {
        eprintln!(
            "warning: JSON schema conversion was incomplete: {}",
            c.warnings.join("; ")
        );
    }
    let mut out = String::new();
    for (k, v) in &c.rules {
        out.push_str(k);
        out.push_str(" ::= ");
        out.push_str(v);
        out.push('\n');
    }
    Ok(out)
}

struct Converter<'a> {
    rules: BTreeMap<String, String>,
    refs: &'a BTreeMap<String, Option<Node>>,
    resolving: HashSet<String>,
    errors: Vec<String>,
    warnings: Vec<String>,
}

impl Converter<'_> {
    /// llama.cpp's `_add_rule`: the rule under `name` (escaped), or under `NAME0`, `NAME1`,
    /// ... when that name holds another body; returns the name used.
    fn add_rule(&mut self, name: &str, body: &str) -> String {
        let esc = rule_name(name);
        match self.rules.get(&esc) {
            None => {
                self.rules.insert(esc.clone(), body.to_string());
                return esc;
            }
            Some(b) if b == body => return esc,
            Some(_) => {}
        }
        let mut i = 0;
        loop {
            let key = format!("{esc}{i}");
            match self.rules.get(&key) {
                Some(b) if b != body => i += 1,
                _ => {
                    self.rules.insert(key.clone(), body.to_string());
                    return key;
                }
            }
        }
    }

    fn add_builtin(&mut self, name: &str, which: &str) -> String {
        let Some(b) = builtin(which) else {
            self.errors.push(format!("rule {which} not known"));
            return String::new();
        };
        let n = self.add_rule(name, b.body);
        for dep in b.deps {
            if !self.rules.contains_key(*dep) {
                self.add_builtin(dep, dep);
            }
        }
        n
    }

    fn primitive(&mut self, rule_name: &str, kind: &str) -> String {
        let name = if rule_name == "root" { "root" } else { kind };
        self.add_builtin(name, kind)
    }

    fn visit(&mut self, node: &Node, name: &str) -> String {
        let rule_name = if is_reserved(name) {
            format!("{name}-")
        } else if name.is_empty() {
            "root".to_string()
        } else {
            name.to_string()
        };
        let sub = if name.is_empty() {
            String::new()
        } else {
            format!("{name}-")
        };
        match node {
            Node::Ref(r) => {
                let body = self.resolve_ref(r);
                self.add_rule(&rule_name, &body)
            }
            Node::AnyOf(alts) => {
                let body = self.union(name, alts);
                self.add_rule(&rule_name, &body)
            }
            Node::AllOf(children) => self.all_of(children, name, &rule_name),
            Node::Const(v) => self.add_rule(&rule_name, &constant(v)),
            Node::Enum(values) => {
                let alts: Vec<String> = values.iter().map(constant).collect();
                self.add_rule(&rule_name, &format!("({})", alts.join(" | ")))
            }
            Node::Object { props, additional } => {
                if props.is_empty() && matches!(additional.as_deref(), Some(Node::Any)) {
                    let obj = self.add_builtin("object", "object");
                    return self.add_rule(&rule_name, &obj);
                }
                let props: Vec<(&str, &Node, bool)> =
                    props.iter().map(|(k, n, r)| (k.as_str(), n, *r)).collect();
                let body = self.object_rule(&props, name, additional.as_deref());
                self.add_rule(&rule_name, &body)
            }
            Node::Tuple(items) => {
                let mut body = String::from("\"[\" space ");
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        body.push_str(" \",\" space ");
                    }
                    let r = self.visit(item, &format!("{sub}tuple-{i}"));
                    body.push_str(&r);
                }
                body.push_str(" space \"]\"");
                self.add_rule(&rule_name, &body)
            }
            Node::Array { items, min, max } => {
                if matches!(**items, Node::Any) && *min == 0 && max.is_none() {
                    return self.primitive(&rule_name, "array");
                }
                let item = self.visit(items, &format!("{sub}item"));
                let body = format!(
                    "\"[\" space {} space \"]\"",
                    repetition(&item, *min, *max, "\",\" space")
                );
                self.add_rule(&rule_name, &body)
            }
            Node::String {
                pattern,
                format,
                min_len,
                max_len,
            } => {
                if let Some(p) = pattern {
                    return self.visit_pattern(p, &rule_name);
                }
                match format {
                    Format::Uuid => return self.primitive(&rule_name, "uuid"),
                    Format::Date | Format::Time | Format::DateTime => {
                        let prim = match format {
                            Format::Date => "date-string",
                            Format::Time => "time-string",
                            _ => "date-time-string",
                        };
                        let r = self.add_builtin(prim, prim);
                        return self.add_rule(&rule_name, &r);
                    }
                    Format::None => {}
                }
                if *min_len > 0 || max_len.is_some() {
                    let ch = self.add_builtin("char", "char");
                    let body = format!(
                        "\"\\\"\" {} \"\\\"\"",
                        repetition(&ch, *min_len, *max_len, "")
                    );
                    return self.add_rule(&rule_name, &body);
                }
                self.primitive(&rule_name, "string")
            }
            Node::Integer { min, max } => {
                if min.is_none() && max.is_none() {
                    return self.primitive(&rule_name, "integer");
                }
                let mut out = String::from("(");
                int_range(*min, *max, &mut out, 16, true);
                out.push(')');
                self.add_rule(&rule_name, &out)
            }
            Node::Number => self.primitive(&rule_name, "number"),
            Node::Boolean => self.primitive(&rule_name, "boolean"),
            Node::Null => self.primitive(&rule_name, "null"),
            Node::Any => {
                let v = self.add_builtin("value", "value");
                self.add_rule(&rule_name, &v)
            }
        }
    }

    fn union(&mut self, name: &str, alts: &[Node]) -> String {
        let rules: Vec<String> = alts
            .iter()
            .enumerate()
            .map(|(i, a)| {
                let n = if name.is_empty() {
                    format!("alternative-{i}")
                } else {
                    format!("{name}-{i}")
                };
                self.visit(a, &n)
            })
            .collect();
        rules.join(" | ")
    }

    fn resolve_ref(&mut self, r: &str) -> String {
        let fragment = r.split_once('#').map_or(r, |(_, f)| f);
        let ref_name = format!("ref{}", rule_name(fragment));
        if !self.rules.contains_key(&ref_name) && !self.resolving.contains(r) {
            let Some(Some(target)) = self.refs.get(r) else {
                self.errors.push(format!("unresolved $ref {r}"));
                return String::new();
            };
            self.resolving.insert(r.to_string());
            let n = self.visit(target, &ref_name);
            self.resolving.remove(r);
            return n;
        }
        ref_name
    }

    fn all_of(&mut self, children: &[Node], name: &str, rule_name: &str) -> String {
        let mut required: HashSet<String> = HashSet::new();
        let mut props: Vec<(String, &Node)> = Vec::new();
        let mut enum_counts: BTreeMap<String, usize> = BTreeMap::new();
        fn add<'n>(
            refs: &'n BTreeMap<String, Option<Node>>,
            comp: &'n Node,
            is_required: bool,
            required: &mut HashSet<String>,
            props: &mut Vec<(String, &'n Node)>,
            enum_counts: &mut BTreeMap<String, usize>,
            depth: usize,
        ) {
            match comp {
                Node::Ref(r) if depth < 64 => {
                    if let Some(Some(t)) = refs.get(r) {
                        add(
                            refs,
                            t,
                            is_required,
                            required,
                            props,
                            enum_counts,
                            depth + 1,
                        );
                    }
                }
                Node::Object { props: ps, .. } => {
                    for (k, n, _) in ps {
                        props.push((k.clone(), n));
                        if is_required {
                            required.insert(k.clone());
                        }
                    }
                }
                Node::Enum(values) => {
                    for v in values {
                        *enum_counts.entry(constant(v)).or_default() += 1;
                    }
                }
                _ => {}
            }
        }
        let refs = self.refs;
        for child in children {
            if let Node::AnyOf(alts) = child {
                for a in alts {
                    add(
                        refs,
                        a,
                        false,
                        &mut required,
                        &mut props,
                        &mut enum_counts,
                        0,
                    );
                }
            } else {
                add(
                    refs,
                    child,
                    true,
                    &mut required,
                    &mut props,
                    &mut enum_counts,
                    0,
                );
            }
        }
        if !enum_counts.is_empty() {
            let common: Vec<&str> = enum_counts
                .iter()
                .filter(|(_, &n)| n == children.len())
                .map(|(k, _)| k.as_str())
                .collect();
            if !common.is_empty() {
                return self.add_rule(rule_name, &format!("({})", common.join(" | ")));
            }
        }
        let props: Vec<(&str, &Node, bool)> = props
            .iter()
            .map(|(k, n)| (k.as_str(), *n, required.contains(k)))
            .collect();
        let body = self.object_rule(&props, name, None);
        self.add_rule(rule_name, &body)
    }

    /// llama.cpp's `_build_object_rule`: required properties in order, then the optional
    /// ones (and `additionalProperties`) as chains of optional rules.
    fn object_rule(
        &mut self,
        props: &[(&str, &Node, bool)],
        name: &str,
        additional: Option<&Node>,
    ) -> String {
        let dash = if name.is_empty() { "" } else { "-" };
        let mut required = Vec::new();
        let mut optional = Vec::new();
        let mut kv: HashMap<String, String> = HashMap::new();
        let mut names = Vec::new();
        for &(prop, schema, is_required) in props {
            let r = self.visit(schema, &format!("{name}{dash}{prop}"));
            let body = format!(
                "{} space \":\" space {r}",
                literal(&dump(&Value::String(prop.to_string())))
            );
            let k = self.add_rule(&format!("{name}{dash}{prop}-kv"), &body);
            kv.insert(prop.to_string(), k);
            if is_required {
                required.push(prop.to_string());
            } else {
                optional.push(prop.to_string());
            }
            names.push(prop.to_string());
        }
        if let Some(add) = additional {
            let sub = format!("{name}{dash}additional");
            let value = if matches!(add, Node::Any) {
                self.add_builtin("value", "value")
            } else {
                self.visit(add, &format!("{sub}-value"))
            };
            let key = if names.is_empty() {
                self.add_builtin("string", "string")
            } else {
                let body = self.not_strings(&names);
                self.add_rule(&format!("{sub}-k"), &body)
            };
            let k = self.add_rule(&format!("{sub}-kv"), &format!("{key} \":\" space {value}"));
            kv.insert("*".into(), k);
            optional.push("*".into());
        }
        if required.is_empty() && optional.is_empty() {
            return "\"{\" space \"}\"".into();
        }
        let mut rule = String::from("\"{\" space ");
        for (i, p) in required.iter().enumerate() {
            if i > 0 {
                rule.push_str(" \",\" space ");
            }
            rule.push_str(kv.get(p).map_or("", String::as_str));
        }
        if !optional.is_empty() {
            rule.push_str(" (");
            if !required.is_empty() {
                rule.push_str(" \",\" space ( ");
            }
            for i in 0..optional.len() {
                if i > 0 {
                    rule.push_str(" | ");
                }
                let r = self.optional_chain(&optional[i..], false, name, &kv);
                rule.push_str(&r);
            }
            if !required.is_empty() {
                rule.push_str(" )");
            }
            rule.push_str(" )?");
        }
        rule.push_str(" space \"}\"");
        rule
    }

    /// llama.cpp's `get_recursive_refs`: `ks[0]`, then a rule for the rest, each optional.
    fn optional_chain(
        &mut self,
        ks: &[String],
        first_optional: bool,
        name: &str,
        kv: &HashMap<String, String>,
    ) -> String {
        let Some(k) = ks.first() else {
            return String::new();
        };
        let kv_rule = kv.get(k).cloned().unwrap_or_default();
        let comma = format!("( \",\" space {kv_rule} )");
        let mut res = if first_optional {
            format!("{comma}{}", if k == "*" { "*" } else { "?" })
        } else if k == "*" {
            format!("{kv_rule} {comma}*")
        } else {
            kv_rule
        };
        if ks.len() > 1 {
            let dash = if name.is_empty() { "" } else { "-" };
            let body = self.optional_chain(&ks[1..], true, name, kv);
            let r = self.add_rule(&format!("{name}{dash}{k}-rest"), &body);
            res.push(' ');
            res.push_str(&r);
        }
        res
    }

    /// llama.cpp's `_not_strings`: a JSON string that is none of `strings` (a trie of them).
    fn not_strings(&mut self, strings: &[String]) -> String {
        #[derive(Default)]
        struct TrieNode {
            children: BTreeMap<char, usize>,
            end: bool,
        }
        // The trie is walked recursively, one level per character.
        if let Some(long) = strings.iter().find(|s| s.chars().count() > MAX_NAME) {
            self.errors.push(format!(
                "property name {:?}... is longer than {MAX_NAME} characters",
                long.chars().take(20).collect::<String>()
            ));
            return String::new();
        }
        let mut nodes = vec![TrieNode::default()];
        for s in strings {
            let mut at = 0;
            for c in s.chars() {
                at = match nodes[at].children.get(&c) {
                    Some(&n) => n,
                    None => {
                        nodes.push(TrieNode::default());
                        let n = nodes.len() - 1;
                        nodes[at].children.insert(c, n);
                        n
                    }
                };
            }
            nodes[at].end = true;
        }
        let ch = self.add_builtin("char", "char");
        let mut out = String::from("[\"] ( ");
        fn walk(nodes: &[TrieNode], at: usize, ch: &str, out: &mut String) {
            let mut rejects = String::new();
            let mut first = true;
            for (&c, &child) in &nodes[at].children {
                rejects.push(c);
                if !first {
                    out.push_str(" | ");
                }
                first = false;
                out.push('[');
                out.push(c);
                out.push(']');
                if nodes[child].children.is_empty() {
                    out.push(' ');
                    out.push_str(ch);
                    out.push('+');
                } else {
                    out.push_str(" (");
                    walk(nodes, child, ch, out);
                    out.push(')');
                }
            }
            if !nodes[at].children.is_empty() {
                out.push_str(&format!(" | [^\"{rejects}] {ch}*"));
            }
        }
        walk(&nodes, 0, &ch, &mut out);
        out.push_str(" )");
        if !nodes[0].end {
            out.push('?');
        }
        out.push_str(" [\"]");
        out
    }

    /// A string matching an anchored regular expression (llama.cpp `_visit_pattern`): an
    /// unsupported construct accepts any string (with a warning), an invalid one is an error.
    fn visit_pattern(&mut self, p: &str, name: &str) -> String {
        let snapshot = self.rules.clone();
        match pattern::to_rule(self, p, name) {
            Ok(r) => r,
            Err(pattern::PatternError::Unsupported(why)) => {
                self.rules = snapshot;
                self.warnings.push(format!(
                    "pattern {} is not supported ({why}), accepting any string",
                    shorten(p)
                ));
                let s = self.add_builtin("string", "string");
                self.add_rule(name, &s)
            }
            Err(pattern::PatternError::Invalid(why)) => {
                self.rules = snapshot;
                self.errors
                    .push(format!("invalid pattern {}: {why}", shorten(p)));
                String::new()
            }
        }
    }
}

/// `p`, cut to 80 characters for a message.
fn shorten(p: &str) -> String {
    if p.chars().count() <= 80 {
        p.to_string()
    } else {
        format!("{}...", p.chars().take(80).collect::<String>())
    }
}

/// `n` nines, zeros, ...
fn repeat(c: char, n: usize) -> String {
    std::iter::repeat_n(c, n).collect()
}

fn digit_range(from: u8, to: u8, out: &mut String) {
    out.push('[');
    out.push(from as char);
    if from != to {
        out.push('-');
        out.push(to as char);
    }
    out.push(']');
}

/// `[0-9]` repeated `min` to `max` times (`usize::MAX`: unbounded), as llama.cpp writes it.
fn more_digits(min: usize, max: usize, out: &mut String) {
    out.push_str("[0-9]");
    if min == max && min == 1 {
        return;
    }
    out.push('{');
    out.push_str(&min.to_string());
    if max != min {
        out.push(',');
        if max != usize::MAX {
            out.push_str(&max.to_string());
        }
    }
    out.push('}');
}

/// Decimal strings from `from` to `to` of the same length (llama.cpp's `uniform_range`).
fn uniform_range(from: &[u8], to: &[u8], out: &mut String) {
    let mut i = 0;
    while i < from.len() && i < to.len() && from[i] == to[i] {
        i += 1;
    }
    if i > 0 {
        out.push('"');
        out.push_str(std::str::from_utf8(&from[..i]).unwrap_or(""));
        out.push('"');
    }
    if i < from.len() && i < to.len() {
        if i > 0 {
            out.push(' ');
        }
        let sub_len = from.len() - i - 1;
        if sub_len > 0 {
            let from_sub = &from[i + 1..];
            let to_sub = &to[i + 1..];
            let zeros = repeat('0', sub_len);
            let nines = repeat('9', sub_len);
            let mut to_reached = false;
            out.push('(');
            if from_sub == zeros.as_bytes() {
                digit_range(from[i], to[i] - 1, out);
                out.push(' ');
                more_digits(sub_len, sub_len, out);
            } else {
                out.push('[');
                out.push(from[i] as char);
                out.push_str("] (");
                uniform_range(from_sub, nines.as_bytes(), out);
                out.push(')');
                if from[i] < to[i] - 1 {
                    out.push_str(" | ");
                    if to_sub == nines.as_bytes() {
                        digit_range(from[i] + 1, to[i], out);
                        to_reached = true;
                    } else {
                        digit_range(from[i] + 1, to[i] - 1, out);
                    }
                    out.push(' ');
                    more_digits(sub_len, sub_len, out);
                }
            }
            if !to_reached {
                out.push_str(" | ");
                digit_range(to[i], to[i], out);
                out.push(' ');
                uniform_range(zeros.as_bytes(), to_sub, out);
            }
            out.push(')');
        } else {
            out.push('[');
            out.push(from[i] as char);
            out.push('-');
            out.push(to[i] as char);
            out.push(']');
        }
    }
}

/// Integers from `min` to `max` (`None`: unbounded) as llama.cpp's `build_min_max_int`
/// writes them: `decimals` digits at most where unbounded, leading zeros refused.
fn int_range(min: Option<i64>, max: Option<i64>, out: &mut String, decimals: usize, top: bool) {
    let less = decimals.saturating_sub(1).max(1);
    match (min, max) {
        (Some(mut lo), Some(hi)) => {
            if lo < 0 && hi < 0 {
                out.push_str("\"-\" (");
                int_range(
                    Some(hi.saturating_neg()),
                    Some(lo.saturating_neg()),
                    out,
                    decimals,
                    true,
                );
                out.push(')');
                return;
            }
            if lo < 0 {
                out.push_str("\"-\" (");
                int_range(Some(0), Some(lo.saturating_neg()), out, decimals, true);
                out.push_str(") | ");
                lo = 0;
            }
            let mut lo_s = lo.to_string();
            let hi_s = hi.to_string();
            for digits in lo_s.len()..hi_s.len() {
                uniform_range(lo_s.as_bytes(), repeat('9', digits).as_bytes(), out);
                lo_s = format!("1{}", repeat('0', digits));
                out.push_str(" | ");
            }
            uniform_range(lo_s.as_bytes(), hi_s.as_bytes(), out);
        }
        (Some(lo), None) => {
            if lo < 0 {
                out.push_str("\"-\" (");
                int_range(None, Some(lo.saturating_neg()), out, decimals, false);
                out.push_str(") | [0] | [1-9] ");
                more_digits(0, decimals.saturating_sub(1), out);
            } else if lo == 0 {
                if top {
                    out.push_str("[0] | [1-9] ");
                    more_digits(0, less, out);
                } else {
                    more_digits(1, decimals, out);
                }
            } else if lo <= 9 {
                let c = b'0' + lo as u8;
                let start = if top { b'1' } else { b'0' };
                if c > start {
                    digit_range(start, c - 1, out);
                    out.push(' ');
                    more_digits(1, less, out);
                    out.push_str(" | ");
                }
                digit_range(c, b'9', out);
                out.push(' ');
                more_digits(0, less, out);
            } else {
                let s = lo.to_string();
                let len = s.len();
                let c = s.as_bytes()[0];
                if c > b'1' {
                    digit_range(if top { b'1' } else { b'0' }, c - 1, out);
                    out.push(' ');
                    more_digits(len, less, out);
                    out.push_str(" | ");
                }
                digit_range(c, c, out);
                out.push_str(" (");
                let rest: i64 = s[1..].parse().unwrap_or(0);
                int_range(Some(rest), None, out, less, false);
                out.push(')');
                if c < b'9' {
                    out.push_str(" | ");
                    digit_range(c + 1, b'9', out);
                    out.push(' ');
                    more_digits(len - 1, less, out);
                }
            }
        }
        (None, Some(hi)) => {
            if hi >= 0 {
                if top {
                    out.push_str("\"-\" [1-9] ");
                    more_digits(0, less, out);
                    out.push_str(" | ");
                }
                int_range(Some(0), Some(hi), out, decimals, true);
            } else {
                out.push_str("\"-\" (");
                int_range(Some(hi.saturating_neg()), None, out, decimals, false);
                out.push(')');
            }
        }
        (None, None) => {}
    }
}
