//! Where the REPL's messages come from: a terminal (line editing and history with
//! rustyline) or a pipe (one message per line, no prompts, no escape codes). On both, a line
//! holding only `"""` opens a block that the next such line closes: the lines between are one
//! message (a pasted text stays one message either way on a terminal: rustyline keeps a
//! bracketed paste together).

use std::io::BufRead;

/// What one read gave.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Read {
    /// A line: a message or a command.
    Text(String),
    /// A `"""` block, its lines joined with newlines: always a message.
    Block(String),
    /// Ctrl-C at the prompt.
    Interrupted,
    /// End of input (Ctrl-D, or the end of the pipe).
    Eof,
}

/// A source of lines.
pub trait Lines {
    /// The next line, showing `prompt` where there is someone to see it.
    ///
    /// # Errors
    /// A read error of the terminal or the pipe.
    fn line(&mut self, prompt: &str) -> anyhow::Result<Read>;

    /// Remembers a message for the history (terminal only).
    fn remember(&mut self, _text: &str) {}
}

/// The next message from `lines`: a line, or a `"""` block (a block left open at the end of
/// the input is sent as it is).
///
/// # Errors
/// As [`Lines::line`].
pub fn read_message(lines: &mut dyn Lines, prompt: &str) -> anyhow::Result<Read> {
    let first = match lines.line(prompt)? {
        Read::Text(t) | Read::Block(t) => t,
        other => return Ok(other),
    };
    if first.trim() != "\"\"\"" {
        if !first.trim().is_empty() {
            lines.remember(&first);
        }
        return Ok(Read::Text(first));
    }
    let mut block: Vec<String> = Vec::new();
    loop {
        match lines.line("... ")? {
            Read::Text(t) if t.trim() == "\"\"\"" => break,
            Read::Text(t) | Read::Block(t) => block.push(t),
            Read::Eof => break,
            Read::Interrupted => return Ok(Read::Interrupted),
        }
    }
    let text = block.join("\n");
    lines.remember(&text);
    Ok(Read::Block(text))
}

/// Lines from a pipe or a file: no prompt is shown.
pub struct Piped<R> {
    reader: R,
}

impl<R: BufRead> Piped<R> {
    /// Lines of `reader`.
    pub fn new(reader: R) -> Piped<R> {
        Piped { reader }
    }
}

impl<R: BufRead> Lines for Piped<R> {
    fn line(&mut self, _prompt: &str) -> anyhow::Result<Read> {
        let mut buf = Vec::new();
        if self.reader.read_until(b'\n', &mut buf)? == 0 {
            return Ok(Read::Eof);
        }
        while matches!(buf.last(), Some(b'\n' | b'\r')) {
            buf.pop();
        }
        Ok(Read::Text(String::from_utf8_lossy(&buf).into_owned()))
    }
}

/// Lines from a terminal, with editing and history (rustyline).
pub struct Terminal {
    editor: rustyline::DefaultEditor,
}

impl Terminal {
    /// A line editor on the terminal.
    ///
    /// # Errors
    /// The terminal cannot be set up.
    pub fn new() -> anyhow::Result<Terminal> {
        Ok(Terminal {
            editor: rustyline::DefaultEditor::new()?,
        })
    }
}

impl Lines for Terminal {
    fn line(&mut self, prompt: &str) -> anyhow::Result<Read> {
        match self.editor.readline(prompt) {
            Ok(l) => Ok(Read::Text(l)),
            Err(rustyline::error::ReadlineError::Interrupted) => Ok(Read::Interrupted),
            Err(rustyline::error::ReadlineError::Eof) => Ok(Read::Eof),
            Err(e) => Err(e.into()),
        }
    }

    fn remember(&mut self, text: &str) {
        let _ = self.editor.add_history_entry(text);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_are_one_message() {
        let text = "hello\n\"\"\"\nline one\n\nline two\n\"\"\"\nbye\n\"\"\"\nopen";
        let mut p = Piped::new(text.as_bytes());
        let mut got = Vec::new();
        loop {
            match read_message(&mut p, "> ").unwrap() {
                Read::Text(t) | Read::Block(t) => got.push(t),
                Read::Eof => break,
                Read::Interrupted => unreachable!(),
            }
        }
        assert_eq!(got, ["hello", "line one\n\nline two", "bye", "open"]);
    }
}
