//! Chat templates: turning a conversation into the prompt text a model was trained on.
//!
//! A GGUF model carries its template as Jinja source in `tokenizer.chat_template` (named
//! variants in `tokenizer.chat_template.NAME`). [`ChatTemplate`] compiles one and renders it
//! the way Hugging Face `transformers` `apply_chat_template` does (the reference that
//! `../shared/templates/` was produced with, and that llama.cpp's `--jinja` mode follows); see
//! [`template`] for the exact render context and the sandbox limits.
//!
//! - [`template`]: [`ChatTemplate`], [`RenderOptions`], [`RenderLimits`], [`ChatError`].
//! - [`source`]: which template to use (user file, named variant, default, ChatML fallback —
//!   llama.cpp's order).
//! - [`messages`]: OpenAI messages checked and their content parts joined, for a template.
//! - [`model`]: the template and BOS/EOS texts of a GGUF model.
//! - [`time`]: [`CivilTime`] and `strftime` for `strftime_now`.
//! - [`pyfmt`]: Python's `str()` and `json.dumps` of template values.
//! - [`preprocess`]: rewriting `{% generation %}` blocks, which minijinja does not know.
//! - [`tools`]: tool-call formats (one module each): detection, grammar, parsing.
//! - [`reply`]: the model's text read back into reasoning, content and tool calls.
//!
//! ```
//! use runtime::chat::{ChatTemplate, RenderOptions};
//! let t = ChatTemplate::new(
//!     "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}",
//!     "<s>",
//!     "</s>",
//! )
//! .unwrap();
//! let msgs = [serde_json::json!({"role": "user", "content": "hi"})];
//! assert_eq!(t.render(&msgs, &RenderOptions::default()).unwrap(), "[user] hi\n");
//! ```

pub mod messages;
pub mod model;
pub mod preprocess;
pub mod pyfmt;
pub mod reply;
pub mod source;
pub mod template;
pub mod time;
pub mod tools;

pub use messages::{normalize_messages, MessageError};
pub use model::template_for_model;
pub use source::{
    builtin_template, choose_template, metadata_key, user_template, TemplateOrigin, BUILTIN_NAMES,
    CHATML_FALLBACK, GEMMA_BUILTIN,
};
pub use template::{ChatError, ChatTemplate, RenderLimits, RenderOptions};
pub use time::CivilTime;
