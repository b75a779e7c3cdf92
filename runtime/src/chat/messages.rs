//! A conversation as clients send it, made ready for a template: OpenAI's messages, whose
//! `content` is a string, null, or a list of parts (`[{"type": "text", "text": "Hi"}]`),
//! checked as llama-server checks them and with their text parts joined, as llama.cpp joins
//! them before rendering (`common_chat_msgs_parse_oaicompat`, `concat_content_parts`). The
//! one path for the server's chat endpoints, its `/apply-template` and `modelc template`.

use serde_json::Value;

/// Why messages were refused, with llama-server's words; the kind is its HTTP status.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MessageError {
    /// A malformed request (llama-server answers 400).
    Invalid(String),
    /// What llama-server reports as a server error (500): media parts (no projector here)
    /// and messages its parser refuses ("Failed to parse messages: ...").
    Unsupported(String),
}

impl std::fmt::Display for MessageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MessageError::Invalid(m) | MessageError::Unsupported(m) => f.write_str(m),
        }
    }
}

impl std::error::Error for MessageError {}

/// llama-server's checks of a chat request's messages, in its order and with its messages
/// (`oaicompat_chat_params_parse`, then `common_chat_msgs_parse_oaicompat`): each an
/// object, content where a role needs it, content a string, null or a list of parts, parts
/// of type text (media: [`MessageError::Unsupported`]), a role in every message.
///
/// # Errors
/// The first message that fails, as said.
pub fn check_messages(messages: &[Value]) -> Result<(), MessageError> {
    let invalid = |m: &str| MessageError::Invalid(m.to_string());
    if let Some(i) = messages.iter().position(|m| !m.is_object()) {
        return Err(MessageError::Invalid(format!(
            "\"messages\"[{i}] must be an object"
        )));
    }
    for m in messages {
        let role = m.get("role").and_then(Value::as_str).unwrap_or("");
        let content = m.get("content");
        if role != "assistant" && content.is_none() {
            return Err(invalid("All non-assistant messages must contain 'content'"));
        }
        if role == "assistant" && content.is_none() {
            if m.get("tool_calls").is_none() {
                return Err(invalid(
                    "Assistant message must contain either 'content' or 'tool_calls'!",
                ));
            }
            continue;
        }
        let parts = match content {
            Some(Value::Array(parts)) => parts,
            Some(Value::String(_) | Value::Null) | None => continue,
            Some(_) => return Err(invalid("Expected 'content' to be a string or an array")),
        };
        for p in parts {
            let media = match p.get("type").and_then(Value::as_str).unwrap_or("") {
                "text" => continue,
                "image_url" => "image",
                "input_audio" => "audio",
                "input_video" | "video_url" => "video",
                _ => return Err(invalid("unsupported content[].type")),
            };
            return Err(MessageError::Unsupported(format!(
                "{media} input is not supported - hint: if this is unexpected, you may need to provide the mmproj"
            )));
        }
    }
    for m in messages {
        let parse_error =
            |e: String| MessageError::Unsupported(format!("Failed to parse messages: {e}"));
        if m.get("role").is_none() {
            return Err(parse_error(format!("Missing 'role' in message: {m}")));
        }
        if let Some(Value::Array(parts)) = m.get("content") {
            if let Some(p) = parts.iter().find(|p| !p["text"].is_string()) {
                return Err(parse_error(format!(
                    "a text part without a string 'text': {p}"
                )));
            }
        }
    }
    Ok(())
}

/// A message's text parts joined (after [`check_messages`]) with `sep`: `"\n"` in the
/// messages a template renders (llama.cpp's `concat_content_parts`), `"\n\n"` in a continued
/// final message (`common_chat_msg::render_content`). A string content is itself; no
/// content is empty.
pub fn content_text(content: Option<&Value>, sep: &str) -> String {
    match content {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => parts
            .iter()
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .collect::<Vec<_>>()
            .join(sep),
        _ => String::new(),
    }
}

/// `messages` checked ([`check_messages`]) and each with a list of text parts replaced by
/// its text ([`content_text`] with `"\n"`): what a template is given. Other fields stay.
///
/// # Errors
/// As [`check_messages`].
pub fn normalize_messages(messages: &[Value]) -> Result<Vec<Value>, MessageError> {
    check_messages(messages)?;
    Ok(messages
        .iter()
        .filter_map(Value::as_object)
        .map(|o| {
            let mut o = o.clone();
            if let Some(Value::Array(_)) = o.get("content") {
                let text = content_text(o.get("content"), "\n");
                o.insert("content".into(), Value::String(text));
            }
            Value::Object(o)
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Text parts are joined with a newline; string and null contents stay; media and
    /// unknown part types are refused with llama-server's kinds.
    #[test]
    fn parts_joined_and_media_refused() {
        let m = [
            json!({"role": "system", "content": "S"}),
            json!({"role": "user", "content": [{"type": "text", "text": "Hi"}, {"type": "text", "text": "there"}]}),
            json!({"role": "assistant", "content": null, "tool_calls": []}),
        ];
        let n = normalize_messages(&m).unwrap();
        assert_eq!(n[0]["content"], "S");
        assert_eq!(n[1]["content"], "Hi\nthere");
        assert!(n[2]["content"].is_null());
        let image = [json!({"role": "user", "content": [{"type": "image_url", "image_url": {}}]})];
        assert!(matches!(
            normalize_messages(&image),
            Err(MessageError::Unsupported(_))
        ));
        let odd = [json!({"role": "user", "content": [{"type": "odd"}]})];
        assert!(matches!(
            normalize_messages(&odd),
            Err(MessageError::Invalid(_))
        ));
        assert!(matches!(
            normalize_messages(&[json!("hi")]),
            Err(MessageError::Invalid(_))
        ));
    }
}
