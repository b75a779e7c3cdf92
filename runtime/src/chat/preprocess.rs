//! Source rewriting before minijinja compiles a template.
//!
//! Hugging Face's `AssistantTracker` Jinja extension adds a `{% generation %}…{% endgeneration %}`
//! block that marks the assistant's tokens (for training masks) and renders its body unchanged.
//! minijinja has no such tag, so each `generation` tag becomes an `if true` tag and each
//! `endgeneration` an `endif`, keeping the tag's whitespace-control markers (`{%-`, `-%}`, `+`):
//! an always-true `if` renders its body once, unchanged, and a block tag's trimming
//! (`trim_blocks`, `lstrip_blocks`, `-`) applies to it exactly as it applied to the original.
//!
//! The scan follows the Jinja lexer: text outside tags is copied; `{# … #}` comments and
//! `{% raw %}…{% endraw %}` are copied untouched; inside `{{ … }}` and `{% … %}` quoted strings
//! are skipped, so a `%}` inside a string literal does not end the tag.

/// Replaces `generation` / `endgeneration` block tags (see the module doc). Everything else
/// is returned byte for byte; an unterminated tag or comment is left as is for minijinja to
/// report.
pub fn rewrite_generation_tags(source: &str) -> String {
    let bytes = source.as_bytes();
    let mut out = String::with_capacity(source.len());
    let mut copied = 0; // source[..copied] is already in `out`
    let mut i = 0;
    while i + 1 < bytes.len() {
        if bytes[i] != b'{' {
            i += 1;
            continue;
        }
        match bytes[i + 1] {
            b'#' => {
                // Comment: skip to the closing `#}`.
                match source[i + 2..].find("#}") {
                    Some(end) => i = i + 2 + end + 2,
                    None => break,
                }
            }
            b'{' => match tag_end(source, i + 2, b'}') {
                Some(end) => i = end,
                None => break,
            },
            b'%' => {
                let Some(end) = tag_end(source, i + 2, b'%') else {
                    break;
                };
                let tag = &source[i..end];
                let (open, body, close) = split_block_tag(tag);
                let word = body.trim();
                if word == "raw" {
                    // Copy through to the end of the matching `endraw` tag.
                    match find_endraw(source, end) {
                        Some(after) => i = after,
                        None => break,
                    }
                    continue;
                }
                let replacement = match word {
                    "generation" => Some("if true"),
                    "endgeneration" => Some("endif"),
                    _ => None,
                };
                if let Some(r) = replacement {
                    out.push_str(&source[copied..i]);
                    out.push_str(open);
                    out.push(' ');
                    out.push_str(r);
                    out.push(' ');
                    out.push_str(close);
                    copied = end;
                }
                i = end;
            }
            _ => i += 1,
        }
    }
    out.push_str(&source[copied..]);
    out
}

/// Given the index just after `{{` or `{%`, returns the index just after the closing
/// `}}` / `%}` (`close_first` is `}` or `%`), skipping quoted strings.
fn tag_end(source: &str, mut i: usize, close_first: u8) -> Option<usize> {
    let bytes = source.as_bytes();
    while i < bytes.len() {
        match bytes[i] {
            q @ (b'\'' | b'"') => {
                i += 1;
                while i < bytes.len() && bytes[i] != q {
                    if bytes[i] == b'\\' {
                        i += 1;
                    }
                    i += 1;
                }
                i += 1;
            }
            c if c == close_first && bytes.get(i + 1) == Some(&b'}') => return Some(i + 2),
            _ => i += 1,
        }
    }
    None
}

/// Splits a whole block tag `{%- body +%}` into its opener (`{%`, `{%-` or `{%+`), its body,
/// and its closer (`%}`, `-%}` or `+%}`).
fn split_block_tag(tag: &str) -> (&str, &str, &str) {
    let open_len = if tag[2..].starts_with(['-', '+']) {
        3
    } else {
        2
    };
    let inner_end = tag.len() - 2;
    let close_start = if inner_end > open_len && tag[..inner_end].ends_with(['-', '+']) {
        inner_end - 1
    } else {
        inner_end
    };
    (
        &tag[..open_len],
        &tag[open_len..close_start],
        &tag[close_start..],
    )
}

/// From `from` (just after a `{% raw %}` tag), the index just after the next `endraw` tag.
fn find_endraw(source: &str, from: usize) -> Option<usize> {
    let mut i = from;
    while let Some(off) = source[i..].find("{%") {
        let start = i + off;
        let end = tag_end(source, start + 2, b'%')?;
        let (_, body, _) = split_block_tag(&source[start..end]);
        if body.trim() == "endraw" {
            return Some(end);
        }
        i = start + 2;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rewrites_tags_keeping_markers() {
        let src = "a{%- generation -%}b{% endgeneration %}\n{%+generation%}";
        assert_eq!(
            rewrite_generation_tags(src),
            "a{%- if true -%}b{% endif %}\n{%+ if true %}"
        );
    }

    #[test]
    fn leaves_strings_comments_and_raw_alone() {
        let src = concat!(
            "{{ '{% generation %}' }}{# {% generation %} #}",
            "{% raw %}{% generation %}{% endraw %}{% set x = \"%}\" %}{% endgeneration -%}"
        );
        let want = concat!(
            "{{ '{% generation %}' }}{# {% generation %} #}",
            "{% raw %}{% generation %}{% endraw %}{% set x = \"%}\" %}{% endif -%}"
        );
        assert_eq!(rewrite_generation_tags(src), want);
    }

    #[test]
    fn other_text_is_unchanged() {
        for src in [
            "",
            "{",
            "plain {{ x }}",
            "{% if a %}generation{% endif %}",
            "{% unclosed",
        ] {
            assert_eq!(rewrite_generation_tags(src), src);
        }
    }
}
