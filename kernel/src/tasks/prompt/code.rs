//! What THINK wrote: its first code block in a language the loop runs, or,
//! without one, its answer; and code as the loop compares it, to notice
//! the same block written again.

/// The answer in a reply without code: its text, out of the fence of a
/// block without a language if that is all there is.
pub fn answer_in(reply: &str) -> &str {
    let trimmed = reply.trim();
    trimmed
        .strip_prefix("```\n")
        .and_then(|inner| inner.strip_suffix("```"))
        .filter(|inner| !inner.contains("```"))
        .map_or(trimmed, str::trim)
}

/// The first fenced code block of `text` marked python, py, python3, bash,
/// sh or shell, as (language, code); a block whose first line is a shell's
/// `#!` is bash whatever its mark.
pub fn first_code_block(text: &str) -> Option<(String, String)> {
    let mut lines = text.lines();
    while let Some(line) = lines.next() {
        let Some(tag) = line.trim_start().strip_prefix("```") else {
            continue;
        };
        // A block without a language is not code: models quote an error
        // or set out their answer in one.
        let language = match tag.trim().to_ascii_lowercase().as_str() {
            "python" | "py" | "python3" => "python",
            "bash" | "sh" | "shell" => "bash",
            _ => {
                // Another language's block: its closing fence opens nothing.
                lines.by_ref().find(|l| l.trim_start().starts_with("```"));
                continue;
            }
        };
        let code: Vec<&str> = lines
            .by_ref()
            .take_while(|l| !l.trim_start().starts_with("```"))
            .collect();
        // A shell script fenced as Python says what it is on its first line.
        let shell = code.first().is_some_and(|first| {
            first.starts_with("#!") && (first.ends_with("sh") || first.ends_with("bash"))
        });
        let language = if shell { "bash" } else { language };
        return Some((language.to_owned(), code.join("\n")));
    }
    None
}

/// Code as the loop compares it: the same language and the same text once
/// stripped of surrounding blank space.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Code {
    language: String,
    text: String,
}

impl Code {
    /// `text` in `language`, as compared.
    pub fn new(language: &str, text: &str) -> Code {
        Code {
            language: language.to_owned(),
            text: text.trim().to_owned(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn code_blocks_are_found_by_their_language() {
        let text = "Let me look.\n```python\nprint(1)\nprint(2)\n```\nthen more";
        assert_eq!(
            first_code_block(text),
            Some(("python".into(), "print(1)\nprint(2)".into()))
        );
        assert_eq!(first_code_block("```bash\nls\n```").unwrap().0, "bash");
        assert_eq!(first_code_block("```json\n{}\n```"), None);
        assert_eq!(
            first_code_block("```json\n{}\n```\n```python\nprint(2)\n```"),
            Some(("python".into(), "print(2)".into()))
        );
        assert_eq!(first_code_block("The answer is 4."), None);
        assert_eq!(
            first_code_block("```python\n#!/bin/bash\necho 1\n```")
                .unwrap()
                .0,
            "bash",
            "a shebang says what it is"
        );
        assert_eq!(
            first_code_block("```python\n#!/usr/bin/env python3\nprint(1)\n```")
                .unwrap()
                .0,
            "python"
        );
        assert_eq!(
            first_code_block("```\nNameError: name 'x' is not defined\n```"),
            None,
            "a block without a language is not code"
        );
    }

    #[test]
    fn an_answer_set_out_in_a_bare_block_is_taken_out_of_it() {
        assert_eq!(answer_in("  ```\n42\n```\n"), "42");
        assert_eq!(answer_in("It is 42."), "It is 42.");
        assert_eq!(
            answer_in("```\na\n```\nand\n```\nb\n```"),
            "```\na\n```\nand\n```\nb\n```"
        );
    }
}
