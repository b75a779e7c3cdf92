//! A JSON schema read into a tree of what each part accepts (llama.cpp's
//! `common_chat_schema_from_json`, `common/json-schema.cpp`): `$ref` first, then
//! `oneOf`/`anyOf`, a list of types as alternatives, `const`, `enum`, then the type (or,
//! without one, the structural keywords) decides.

use serde_json::{Map, Value};
use std::collections::BTreeMap;

/// Most nesting of a schema (a guard against stack exhaustion).
const MAX_DEPTH: usize = 200;

/// A string `format` the converter knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    None,
    Date,
    Time,
    DateTime,
    Uuid,
}

/// What a schema accepts.
#[derive(Debug)]
pub enum Node {
    /// Any JSON value.
    Any,
    /// A `$ref` into the document (its target is in the refs map).
    Ref(String),
    /// One of these (`anyOf`, `oneOf`, a list of types).
    AnyOf(Vec<Node>),
    /// All of these (`allOf`).
    AllOf(Vec<Node>),
    /// Exactly this value.
    Const(Value),
    /// One of these values.
    Enum(Vec<Value>),
    Null,
    Boolean,
    Number,
    /// An integer within the (inclusive) bounds.
    Integer {
        min: Option<i64>,
        max: Option<i64>,
    },
    /// A string.
    String {
        pattern: Option<String>,
        format: Format,
        min_len: u64,
        max_len: Option<u64>,
    },
    /// A list of `items`, `min` to `max` long.
    Array {
        items: Box<Node>,
        min: u64,
        max: Option<u64>,
    },
    /// A list of exactly these items.
    Tuple(Vec<Node>),
    /// An object: properties `(name, schema, required)` in order, and what other keys may hold.
    Object {
        props: Vec<(String, Node, bool)>,
        additional: Option<Box<Node>>,
    },
}

/// Reads `root`; `$ref` targets go into `refs` (keyed by the reference text).
///
/// # Errors
/// llama.cpp's refusals: `JSON schema error at PATH: what`.
pub fn build(root: &Value, refs: &mut BTreeMap<String, Option<Node>>) -> Result<Node, String> {
    Builder { root, refs }.node(root, "#", 0)
}

struct Builder<'a> {
    root: &'a Value,
    refs: &'a mut BTreeMap<String, Option<Node>>,
}

fn fail<T>(path: &str, msg: impl std::fmt::Display) -> Result<T, String> {
    Err(format!("JSON schema error at {path}: {msg}"))
}

fn count(o: &Map<String, Value>, key: &str, path: &str) -> Result<Option<u64>, String> {
    match o.get(key) {
        None => Ok(None),
        Some(v) => match v.as_u64() {
            Some(n) if n <= i32::MAX as u64 => Ok(Some(n)),
            _ => fail(path, format!("{key} must be a non-negative integer")),
        },
    }
}

/// A bound, a fractional one rounded inwards.
fn bound(v: &Value, key: &str, path: &str, round_up: bool) -> Result<i64, String> {
    if let Some(i) = v.as_i64() {
        return Ok(i);
    }
    if let Some(u) = v.as_u64() {
        return Ok(i64::try_from(u).unwrap_or(i64::MAX));
    }
    match v.as_f64() {
        Some(d) => Ok(if round_up { d.ceil() } else { d.floor() } as i64),
        None => fail(path, format!("{key} must be a number")),
    }
}

fn format_of(o: &Map<String, Value>, path: &str) -> Result<Format, String> {
    let Some(v) = o.get("format") else {
        return Ok(Format::None);
    };
    let Some(f) = v.as_str() else {
        return fail(path, "format must be a string");
    };
    Ok(match f {
        "date" => Format::Date,
        "time" => Format::Time,
        "date-time" => Format::DateTime,
        "uuid" | "uuid1" | "uuid2" | "uuid3" | "uuid4" | "uuid5" => Format::Uuid,
        _ => Format::None,
    })
}

impl<'a> Builder<'a> {
    fn resolve(&self, r: &str, path: &str) -> Result<&'a Value, String> {
        let mut target = self.root;
        for sel in r.get(1..).unwrap_or("").split('/').skip(1) {
            target = match target {
                Value::Object(o) if o.contains_key(sel) => &o[sel],
                Value::Array(a) => match sel.parse::<usize>().ok().and_then(|i| a.get(i)) {
                    Some(v) => v,
                    None => {
                        return fail(
                            path,
                            format!("cannot resolve $ref {r}, {sel} is out of range"),
                        )
                    }
                },
                _ => return fail(path, format!("cannot resolve $ref {r}, {sel} not found")),
            };
        }
        Ok(target)
    }

    fn reference(&mut self, v: &Value, path: &str, depth: usize) -> Result<Node, String> {
        let Some(r) = v.as_str() else {
            return fail(path, "$ref must be a string");
        };
        if !r.starts_with("#/") {
            return fail(
                path,
                format!(
                    "unsupported $ref {r}, only references into the same document are supported"
                ),
            );
        }
        if !self.refs.contains_key(r) {
            self.refs.insert(r.to_string(), None);
            let target = self.resolve(r, path)?;
            let n = self.node(target, r, depth + 1)?;
            self.refs.insert(r.to_string(), Some(n));
        }
        Ok(Node::Ref(r.to_string()))
    }

    fn alternatives(&mut self, v: &Value, path: &str, depth: usize) -> Result<Vec<Node>, String> {
        let Some(a) = v.as_array() else {
            return fail(path, "must be an array of schemas");
        };
        if a.is_empty() {
            return fail(path, "must not be empty");
        }
        a.iter()
            .enumerate()
            .map(|(i, s)| self.node(s, &format!("{path}/{i}"), depth + 1))
            .collect()
    }

    fn object(&mut self, o: &Map<String, Value>, path: &str, depth: usize) -> Result<Node, String> {
        let required: Vec<&str> = match o.get("required") {
            Some(Value::Array(a)) => a.iter().filter_map(Value::as_str).collect(),
            _ => Vec::new(),
        };
        let mut props = Vec::new();
        if let Some(p) = o.get("properties") {
            let Some(p) = p.as_object() else {
                return fail(path, "properties must be an object");
            };
            for (name, s) in p {
                let n = self.node(s, &format!("{path}/properties/{name}"), depth + 1)?;
                props.push((name.clone(), n, required.contains(&name.as_str())));
            }
        }
        let additional = match o.get("additionalProperties") {
            Some(Value::Bool(true)) => Some(Box::new(Node::Any)),
            Some(Value::Bool(false)) => None,
            Some(v @ Value::Object(_)) => Some(Box::new(self.node(
                v,
                &format!("{path}/additionalProperties"),
                depth + 1,
            )?)),
            Some(_) => return fail(path, "additionalProperties must be a boolean or a schema"),
            None if !o.contains_key("properties") => Some(Box::new(Node::Any)),
            None => None,
        };
        Ok(Node::Object { props, additional })
    }

    fn array(&mut self, o: &Map<String, Value>, path: &str, depth: usize) -> Result<Node, String> {
        let key = if o.contains_key("items") {
            Some("items")
        } else if o.contains_key("prefixItems") {
            Some("prefixItems")
        } else {
            None
        };
        let items = match key {
            Some(key) => {
                let v = &o[key];
                if let Some(a) = v.as_array() {
                    let items = a
                        .iter()
                        .enumerate()
                        .map(|(i, s)| self.node(s, &format!("{path}/{key}/{i}"), depth + 1))
                        .collect::<Result<_, _>>()?;
                    return Ok(Node::Tuple(items));
                }
                self.node(v, &format!("{path}/{key}"), depth + 1)?
            }
            None => Node::Any,
        };
        Ok(Node::Array {
            items: Box::new(items),
            min: count(o, "minItems", path)?.unwrap_or(0),
            max: count(o, "maxItems", path)?,
        })
    }

    fn string(o: &Map<String, Value>, path: &str) -> Result<Node, String> {
        let pattern = match o.get("pattern") {
            None => None,
            Some(Value::String(p)) => Some(p.clone()),
            Some(_) => return fail(path, "pattern must be a string"),
        };
        Ok(Node::String {
            pattern,
            format: format_of(o, path)?,
            min_len: count(o, "minLength", path)?.unwrap_or(0),
            max_len: count(o, "maxLength", path)?,
        })
    }

    fn integer(o: &Map<String, Value>, path: &str) -> Result<Node, String> {
        let min = match (o.get("minimum"), o.get("exclusiveMinimum")) {
            (Some(v), _) => Some(bound(v, "minimum", path, true)?),
            (None, Some(v)) => Some(bound(v, "exclusiveMinimum", path, false)?.saturating_add(1)),
            _ => None,
        };
        let max = match (o.get("maximum"), o.get("exclusiveMaximum")) {
            (Some(v), _) => Some(bound(v, "maximum", path, false)?),
            (None, Some(v)) => Some(bound(v, "exclusiveMaximum", path, true)?.saturating_sub(1)),
            _ => None,
        };
        Ok(Node::Integer { min, max })
    }

    fn node(&mut self, schema: &Value, path: &str, depth: usize) -> Result<Node, String> {
        if depth > MAX_DEPTH {
            return fail(path, format!("nested more than {MAX_DEPTH} deep"));
        }
        let Some(o) = schema.as_object() else {
            return fail(path, "schema must be an object");
        };
        if let Some(r) = o.get("$ref") {
            return self.reference(r, path, depth);
        }
        for key in ["oneOf", "anyOf"] {
            if let Some(v) = o.get(key) {
                return Ok(Node::AnyOf(self.alternatives(
                    v,
                    &format!("{path}/{key}"),
                    depth,
                )?));
            }
        }
        let ty = o.get("type").filter(|t| !t.is_null());
        if let Some(Value::Array(types)) = ty {
            if types.is_empty() {
                return fail(path, "type must not be empty");
            }
            let mut alts = Vec::with_capacity(types.len());
            for (i, t) in types.iter().enumerate() {
                let mut alt = o.clone();
                alt.insert("type".into(), t.clone());
                alts.push(self.node(
                    &Value::Object(alt),
                    &format!("{path}/type/{i}"),
                    depth + 1,
                )?);
            }
            return Ok(Node::AnyOf(alts));
        }
        if let Some(v) = o.get("const") {
            return Ok(Node::Const(v.clone()));
        }
        if let Some(v) = o.get("enum") {
            return match v.as_array() {
                Some(a) if !a.is_empty() => Ok(Node::Enum(a.clone())),
                _ => fail(path, "enum must be a non-empty array"),
            };
        }
        let ty = match ty {
            None => "",
            Some(Value::String(s)) => s.as_str(),
            Some(_) => return fail(path, "type must be a string or an array of strings"),
        };
        let has_properties = o.contains_key("properties")
            || o.get("additionalProperties")
                .is_some_and(|a| a != &Value::Bool(true));
        let all_of = |b: &mut Self| -> Result<Node, String> {
            let v = &o["allOf"];
            Ok(Node::AllOf(b.alternatives(
                v,
                &format!("{path}/allOf"),
                depth,
            )?))
        };
        match ty {
            "" => {
                if has_properties {
                    self.object(o, path, depth)
                } else if o.contains_key("allOf") {
                    all_of(self)
                } else if o.contains_key("items") || o.contains_key("prefixItems") {
                    self.array(o, path, depth)
                } else if o.contains_key("pattern")
                    || o.contains_key("minLength")
                    || o.contains_key("maxLength")
                    || format_of(o, path)? != Format::None
                {
                    Self::string(o, path)
                } else {
                    Ok(Node::Any)
                }
            }
            "object" if !has_properties && o.contains_key("allOf") => all_of(self),
            "object" => self.object(o, path, depth),
            "string" if o.contains_key("allOf") => all_of(self),
            "string" => Self::string(o, path),
            "array" => self.array(o, path, depth),
            "integer" => Self::integer(o, path),
            "number" => Ok(Node::Number),
            "boolean" => Ok(Node::Boolean),
            "null" => Ok(Node::Null),
            other => fail(path, format!("unrecognized type {other}")),
        }
    }
}
