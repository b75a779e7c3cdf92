//! Which template a model uses: its GGUF metadata, a named variant, or the plain fallback.
//!
//! GGUF stores the default template under `tokenizer.chat_template` and named variants under
//! `tokenizer.chat_template.NAME` (e.g. `tool_use`, `rag`) — llama.cpp's
//! `llama_model_chat_template(model, name)`. The choice follows llama.cpp's
//! `common_chat_templates_init` (common/chat.cpp):
//!
//! 1. a template given by the user (`--chat-template-file`) wins;
//! 2. else a named variant when a name is asked for (missing → error);
//! 3. else the default template; a default that is missing, empty, or the literal text
//!    `chatml` is replaced by the `tool_use` variant when the model has one,
//! 4. else by the built-in ChatML fallback, [`CHATML_FALLBACK`].

/// The fallback for models without a chat template: ChatML, as llama.cpp uses in that case.
/// Each message renders as `<|im_start|>ROLE\nCONTENT<|im_end|>\n` (no system prompt is
/// added); with `add_generation_prompt` the prompt ends with `<|im_start|>assistant\n`.
/// A content that is a list of parts contributes the `text` of its `type: text` parts; a
/// missing or `null` content is empty. `bos_token` is not printed.
pub const CHATML_FALLBACK: &str = concat!(
    "{% for message in messages %}",
    "{{ '<|im_start|>' ~ message['role'] ~ '\\n' }}",
    "{% if message['content'] is string %}{{ message['content'] }}",
    "{% elif message['content'] is iterable %}",
    "{% for part in message['content'] %}",
    "{% if part is mapping and part['type'] == 'text' %}{{ part['text'] }}{% endif %}",
    "{% endfor %}",
    "{% endif %}",
    "{{ '<|im_end|>\\n' }}",
    "{% endfor %}",
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}",
);

/// llama.cpp's built-in `gemma` format (`llm_chat_apply_template`, src/llama-chat.cpp), for
/// Gemma models whose GGUF has no template: system messages are trimmed, joined and put before
/// the next user message (followed by a blank line); `assistant` is called `model`; each turn
/// is `<start_of_turn>ROLE\nCONTENT<end_of_turn>\n` with the content trimmed; the generation
/// prompt is `<start_of_turn>model\n`. No BOS is printed (the tokenizer adds it).
pub const GEMMA_BUILTIN: &str = concat!(
    "{% set ns = namespace(system='') %}",
    "{% for message in messages %}",
    "{% if message['role'] == 'system' %}",
    "{% set ns.system = ns.system ~ (message['content'] | trim) %}",
    "{% else %}",
    "{% set role = 'model' if message['role'] == 'assistant' else message['role'] %}",
    "{{ '<start_of_turn>' ~ role ~ '\\n' }}",
    "{% if ns.system and role != 'model' %}",
    "{{ ns.system ~ '\\n\\n' }}{% set ns.system = '' %}",
    "{% endif %}",
    "{{ message['content'] | trim }}{{ '<end_of_turn>\\n' }}",
    "{% endif %}",
    "{% endfor %}",
    "{% if add_generation_prompt %}{{ '<start_of_turn>model\\n' }}{% endif %}",
);

/// llama.cpp's built-in `llama3` format (`llm_chat_apply_template`, src/llama-chat.cpp): each
/// message is `<|start_header_id|>ROLE<|end_header_id|>\n\nCONTENT<|eot_id|>` with the content
/// trimmed; the generation prompt is `<|start_header_id|>assistant<|end_header_id|>\n\n`. No
/// BOS is printed (the tokenizer adds it).
pub const LLAMA3_BUILTIN: &str = concat!(
    "{% for message in messages %}",
    "{{ '<|start_header_id|>' ~ message['role'] ~ '<|end_header_id|>\n\n' }}",
    "{{ message['content'] | trim }}{{ '<|eot_id|>' }}",
    "{% endfor %}",
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}",
);

/// llama.cpp's built-in `command-r` format (`llm_chat_apply_template`, src/llama-chat.cpp):
/// system, user and assistant messages are
/// `<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>` / `<|USER_TOKEN|>` / `<|CHATBOT_TOKEN|>`, the content
/// trimmed, then `<|END_OF_TURN_TOKEN|>`; other roles are left out; the generation prompt is
/// `<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>`.
pub const COMMAND_R_BUILTIN: &str = concat!(
    "{% set names = {'system': 'SYSTEM', 'user': 'USER', 'assistant': 'CHATBOT'} %}",
    "{% for message in messages %}",
    "{% if message['role'] in names %}",
    "{{ '<|START_OF_TURN_TOKEN|><|' ~ names[message['role']] ~ '_TOKEN|>' }}",
    "{{ message['content'] | trim }}{{ '<|END_OF_TURN_TOKEN|>' }}",
    "{% endif %}",
    "{% endfor %}",
    "{% if add_generation_prompt %}{{ '<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>' }}{% endif %}",
);

/// The built-in formats by name, as llama.cpp's `--chat-template NAME` takes them: `chatml`
/// ([`CHATML_FALLBACK`]), `gemma` ([`GEMMA_BUILTIN`]), `llama3` ([`LLAMA3_BUILTIN`]) and
/// `command-r` ([`COMMAND_R_BUILTIN`]). Other names: `None`.
pub fn builtin_template(name: &str) -> Option<&'static str> {
    match name {
        "chatml" => Some(CHATML_FALLBACK),
        "gemma" => Some(GEMMA_BUILTIN),
        "llama3" => Some(LLAMA3_BUILTIN),
        "command-r" => Some(COMMAND_R_BUILTIN),
        _ => None,
    }
}

/// The names [`builtin_template`] knows, in the order error messages list them.
pub const BUILTIN_NAMES: [&str; 4] = ["chatml", "gemma", "llama3", "command-r"];

/// The template text of `--chat-template VALUE`, as llama.cpp reads the flag: a value that
/// contains `{%` or `{{` is a Jinja template's text; anything else must be a built-in
/// format's name ([`builtin_template`]).
///
/// # Errors
/// A value that is neither, in one line listing the names (llama.cpp: "the supplied chat
/// template is not supported").
pub fn user_template(value: &str) -> Result<&str, String> {
    if value.contains("{%") || value.contains("{{") {
        return Ok(value);
    }
    builtin_template(value).ok_or_else(|| {
        format!(
            "--chat-template {value:?}: the supplied chat template is not supported; give a built-in name ({}) or a Jinja template's text (or --chat-template-file FILE)",
            BUILTIN_NAMES.join(", ")
        )
    })
}

/// Where the chosen template came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TemplateOrigin {
    /// Given by the user, e.g. a `--chat-template-file`.
    User,
    /// The GGUF metadata key it was read from.
    Metadata(String),
    /// [`CHATML_FALLBACK`], because the model has no usable template.
    Fallback,
}

/// The GGUF metadata key of the default template (`name` = `None`) or of a named one.
pub fn metadata_key(name: Option<&str>) -> String {
    match name {
        None => "tokenizer.chat_template".to_string(),
        Some(n) => format!("tokenizer.chat_template.{n}"),
    }
}

/// Chooses the template source (see the module doc for the order).
///
/// - `user`: a template the user supplied, if any.
/// - `name`: a named variant to use instead of the default.
/// - `lookup`: reads a string metadata key (`None` when absent or not a string).
///
/// Errors: a message naming the missing key when `name` is given but the model lacks it.
pub fn choose_template(
    user: Option<&str>,
    name: Option<&str>,
    lookup: &dyn Fn(&str) -> Option<String>,
) -> Result<(String, TemplateOrigin), String> {
    if let Some(src) = user {
        return Ok((src.to_string(), TemplateOrigin::User));
    }
    if let Some(n) = name {
        let key = metadata_key(Some(n));
        return match lookup(&key) {
            Some(src) => Ok((src, TemplateOrigin::Metadata(key))),
            None => Err(format!(
                "the model has no chat template named {n:?} (key {key})"
            )),
        };
    }
    let key = metadata_key(None);
    match lookup(&key) {
        Some(src) if !src.is_empty() && src != "chatml" => Ok((src, TemplateOrigin::Metadata(key))),
        _ => {
            let tool_key = metadata_key(Some("tool_use"));
            match lookup(&tool_key) {
                Some(src) if !src.is_empty() => Ok((src, TemplateOrigin::Metadata(tool_key))),
                _ => Ok((CHATML_FALLBACK.to_string(), TemplateOrigin::Fallback)),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A lookup over fixed `(key, value)` pairs.
    fn lookup_in(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let pairs: Vec<(String, String)> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |key| pairs.iter().find(|(k, _)| k == key).map(|(_, v)| v.clone())
    }

    #[test]
    fn order_of_choice() {
        let none = lookup_in(&[]);
        assert_eq!(
            choose_template(None, None, &none).unwrap().1,
            TemplateOrigin::Fallback
        );
        assert_eq!(
            choose_template(Some("U"), None, &none).unwrap().1,
            TemplateOrigin::User
        );
        assert!(choose_template(None, Some("rag"), &none).is_err());
        let tool = ("tokenizer.chat_template.tool_use", "T");
        let l = lookup_in(&[("tokenizer.chat_template", "chatml"), tool]);
        assert_eq!(choose_template(None, None, &l).unwrap().0, "T");
        let l = lookup_in(&[("tokenizer.chat_template", "D"), tool]);
        let (src, origin) = choose_template(None, None, &l).unwrap();
        assert_eq!(
            (src.as_str(), origin),
            ("D", TemplateOrigin::Metadata(metadata_key(None)))
        );
        assert_eq!(choose_template(None, Some("tool_use"), &l).unwrap().0, "T");
    }

    /// `--chat-template`: Jinja text as it is, every built-in name, anything else refused
    /// naming the built-in names.
    #[test]
    fn user_template_is_jinja_or_a_builtin_name() {
        assert_eq!(user_template("{{ x }}"), Ok("{{ x }}"));
        assert_eq!(
            user_template("a{% if 1 %}b{% endif %}"),
            Ok("a{% if 1 %}b{% endif %}")
        );
        for name in BUILTIN_NAMES {
            assert_eq!(user_template(name), Ok(builtin_template(name).unwrap()));
        }
        let e = user_template("chatmll").unwrap_err();
        assert!(
            e.contains("not supported") && e.contains("chatml, gemma"),
            "{e}"
        );
    }
}
