//! Reading a request's JSON body the way llama-server does (`tools/server/server-task.cpp`
//! `params_from_json_cmpl`, `server-common.cpp` `oaicompat_*_params_parse`): a missing or
//! `null` field takes the server's default; a field of the wrong type is a 400 naming it.
//! Unknown fields are ignored.

use super::error::ApiError;
use crate::tokenizer::{TokenId, Vocab};
use serde_json::{Map, Value};

/// A request's body as a JSON object, with typed getters (module doc).
pub struct Body(pub Map<String, Value>);

impl Body {
    /// Parses `bytes` as a JSON object.
    ///
    /// # Errors
    /// 400 for text that is not JSON, or JSON that is not an object.
    pub fn parse(bytes: &[u8]) -> Result<Body, ApiError> {
        let v: Value = serde_json::from_slice(bytes)
            .map_err(|e| ApiError::invalid(format!("the request body is not valid JSON: {e}")))?;
        match v {
            Value::Object(m) => Ok(Body(m)),
            _ => Err(ApiError::invalid("the request body must be a JSON object")),
        }
    }

    /// The field `name`, absent when missing or `null`.
    pub fn get(&self, name: &str) -> Option<&Value> {
        self.0.get(name).filter(|v| !v.is_null())
    }

    /// A number field, as f32.
    ///
    /// # Errors
    /// 400 when present and not a finite number.
    pub fn f32(&self, name: &str) -> Result<Option<f32>, ApiError> {
        match self.get(name) {
            None => Ok(None),
            Some(v) => match v.as_f64() {
                Some(x) if (x as f32).is_finite() => Ok(Some(x as f32)),
                _ => Err(wrong_type(name, "a finite number", v)),
            },
        }
    }

    /// An integer field. A number with a fractional part is cut toward zero, as
    /// llama-server's JSON library converts it (`max_tokens: 2.5` is 2; clients that write
    /// every number as a float, `100.0`, are served).
    ///
    /// # Errors
    /// 400 when present and not a number, or a float beyond the integers (±1e19, NaN).
    pub fn i64(&self, name: &str) -> Result<Option<i64>, ApiError> {
        match self.get(name) {
            None => Ok(None),
            Some(v) => match v.as_i64() {
                Some(x) => Ok(Some(x)),
                None => match (v.as_u64(), v.as_f64()) {
                    (Some(x), _) => Ok(Some(i64::try_from(x).unwrap_or(i64::MAX))),
                    (None, Some(f)) if f.is_finite() && f.abs() < 9.2e18 => {
                        Ok(Some(f.trunc() as i64))
                    }
                    _ => Err(wrong_type(name, "an integer", v)),
                },
            },
        }
    }

    /// A boolean field.
    ///
    /// # Errors
    /// 400 when present and not a boolean.
    pub fn bool(&self, name: &str) -> Result<Option<bool>, ApiError> {
        match self.get(name) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(v) => Err(wrong_type(name, "a boolean", v)),
        }
    }

    /// A string field.
    ///
    /// # Errors
    /// 400 when present and not a string.
    pub fn str(&self, name: &str) -> Result<Option<&str>, ApiError> {
        match self.get(name) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(v) => Err(wrong_type(name, "a string", v)),
        }
    }

    /// A list of strings.
    ///
    /// # Errors
    /// 400 when present and not a list of strings.
    pub fn strings(&self, name: &str) -> Result<Option<Vec<String>>, ApiError> {
        let expected = "a list of strings";
        match self.get(name) {
            None => Ok(None),
            Some(Value::Array(a)) => a
                .iter()
                .map(|w| {
                    w.as_str()
                        .map(str::to_string)
                        .ok_or_else(|| wrong_type(name, expected, w))
                })
                .collect::<Result<_, _>>()
                .map(Some),
            Some(v) => Err(wrong_type(name, expected, v)),
        }
    }

    /// `stop`: a string or a list of strings (OpenAI's shape).
    ///
    /// # Errors
    /// 400 for anything else.
    pub fn stop(&self) -> Result<Vec<String>, ApiError> {
        match self.get("stop") {
            Some(Value::String(s)) => Ok(vec![s.clone()]),
            _ => Ok(self.strings("stop")?.unwrap_or_default()),
        }
    }
}

/// 400: `name` should be `expected`.
pub fn wrong_type(name: &str, expected: &str, got: &Value) -> ApiError {
    let what = match got {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    };
    ApiError::invalid(format!("\"{name}\" must be {expected}, not {what}"))
}

/// `logit_bias` as llama-server reads it (`server-task.cpp` `params_from_json_cmpl`): a
/// list of `[token, bias]` pairs or an object `{token: bias}`, where a token is an id or a
/// text (each of its tokens gets the bias) and a bias is a number or `false` (banned: -inf).
///
/// # Errors
/// 400 for another shape or a token id outside the vocabulary.
pub fn logit_bias(vocab: &Vocab, v: &Value) -> Result<Vec<(TokenId, f32)>, ApiError> {
    const EXPECTED: &str = "a list of [token, bias] pairs or an object {token: bias}";
    let bias_of = |b: &Value| -> Result<f32, ApiError> {
        match b {
            Value::Bool(false) => Ok(f32::NEG_INFINITY),
            Value::Number(n) => n
                .as_f64()
                .map(|x| x as f32)
                .ok_or_else(|| wrong_type("logit_bias", EXPECTED, b)),
            _ => Err(wrong_type("logit_bias", EXPECTED, b)),
        }
    };
    let ids_of = |t: &Value| -> Result<Vec<TokenId>, ApiError> {
        match t {
            Value::Number(_) => match t.as_i64() {
                Some(id) => ids_of_number(vocab, id),
                None => Err(wrong_type("logit_bias", EXPECTED, t)),
            },
            Value::String(s) => match s.parse::<i64>() {
                Ok(id) => ids_of_number(vocab, id),
                Err(_) => Ok(vocab.tokenize(s, false, false)),
            },
            _ => Err(wrong_type("logit_bias", EXPECTED, t)),
        }
    };
    let mut out = Vec::new();
    match v {
        Value::Array(pairs) => {
            for p in pairs {
                match p.as_array().map(Vec::as_slice) {
                    Some([t, b]) => {
                        let b = bias_of(b)?;
                        out.extend(ids_of(t)?.into_iter().map(|id| (id, b)));
                    }
                    _ => return Err(wrong_type("logit_bias", EXPECTED, p)),
                }
            }
        }
        Value::Object(o) => {
            for (t, b) in o {
                let b = bias_of(b)?;
                out.extend(
                    ids_of(&Value::String(t.clone()))?
                        .into_iter()
                        .map(|id| (id, b)),
                );
            }
        }
        _ => return Err(wrong_type("logit_bias", EXPECTED, v)),
    }
    Ok(out)
}

fn ids_of_number(vocab: &Vocab, id: i64) -> Result<Vec<TokenId>, ApiError> {
    vocab
        .check_id(id)
        .map(|id| vec![id])
        .map_err(|e| ApiError::invalid(format!("logit_bias: {e}")))
}
