//! What THINK wrote: its first code block in a language the loop runs, or,
//! without one, its answer; and code as the loop compares it, to notice
//! the same block written again.

/// The answer in a reply without code to run: its text, out of the fence
/// of a block if that is all there is (a bare block, or values set out as
/// a Python block).
pub fn answer_in(reply: &str) -> &str {
    let trimmed = reply.trim();
    trimmed
        .strip_prefix("```")
        .and_then(|rest| rest.split_once('\n'))
        .filter(|(tag, _)| !tag.contains(char::is_whitespace))
        .and_then(|(_, inner)| inner.strip_suffix("```"))
        .filter(|inner| !inner.contains("```"))
        .map_or(trimmed, str::trim)
}

/// `reply` with its last block closed if it was cut before its closing
/// fence (THINK stopped at the loop's stop sequence), as the model wrote
/// it: the history the model sees next shows every block closed.
pub fn with_blocks_closed(mut reply: String) -> String {
    let fences = reply
        .lines()
        .filter(|line| line.trim_start().starts_with("```"))
        .count();
    if fences % 2 == 1 {
        reply.push_str("\n```");
    }
    reply
}

/// A fenced block of THINK's reply that the loop runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Block {
    /// `python` or `bash`.
    pub language: String,
    /// Its text, without the fences.
    pub code: String,
    /// Whether its fence named no language: it is run only if it is code
    /// (the sandbox parses it; text set out in a block is not run).
    pub untagged: bool,
}

/// The block of `text` the loop runs: its first fenced block marked
/// python, py, python3, bash, sh or shell, else its first block without a
/// language (as Python). A block whose first line is a shell's `#!` is
/// bash whatever its mark. Another language's block is never run.
pub fn code_block(text: &str) -> Option<Block> {
    let mut untagged = None;
    let mut lines = text.lines();
    while let Some(line) = lines.next() {
        let Some(tag) = line.trim_start().strip_prefix("```") else {
            continue;
        };
        let tag = tag.trim().to_ascii_lowercase();
        let language = match tag.as_str() {
            "python" | "py" | "python3" => "python",
            "bash" | "sh" | "shell" => "bash",
            "" => "python",
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
        // A shell script fenced as Python, or not fenced as anything, says
        // what it is on its first line.
        let shell = code.first().is_some_and(|first| {
            first.starts_with("#!") && (first.ends_with("sh") || first.ends_with("bash"))
        });
        let block = Block {
            language: if shell { "bash" } else { language }.to_owned(),
            code: code.join("\n"),
            untagged: tag.is_empty() && !shell,
        };
        if !tag.is_empty() {
            return Some(block);
        }
        // A tagged block later in the reply comes first: models quote an
        // error in a bare block, then write the fix.
        untagged.get_or_insert(block);
    }
    untagged
}

/// A reply with no fence at all that begins as Python does, with a call
/// of `print` or an import: small models write their code bare. It is run
/// as a block without a language, so the sandbox decides whether it is
/// code; prose that only mentions `print(` does not parse and stays text.
pub fn unfenced_code(text: &str) -> Option<Block> {
    if text.contains("```") {
        return None;
    }
    let code = text.trim();
    let first = code.lines().next()?.trim_start();
    let starts_as_python = ["print(", "import ", "from "]
        .iter()
        .any(|start| first.starts_with(start));
    starts_as_python.then(|| Block {
        language: "python".into(),
        code: code.to_owned(),
        untagged: true,
    })
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

    fn tagged(language: &str, code: &str) -> Option<Block> {
        Some(Block {
            language: language.into(),
            code: code.into(),
            untagged: false,
        })
    }

    #[test]
    fn code_blocks_are_found_by_their_language() {
        let text = "Let me look.\n```python\nprint(1)\nprint(2)\n```\nthen more";
        assert_eq!(code_block(text), tagged("python", "print(1)\nprint(2)"));
        assert_eq!(code_block("```bash\nls\n```").unwrap().language, "bash");
        assert_eq!(code_block("```json\n{}\n```"), None);
        assert_eq!(
            code_block("```json\n{}\n```\n```python\nprint(2)\n```"),
            tagged("python", "print(2)")
        );
        assert_eq!(code_block("The answer is 4."), None);
        assert_eq!(
            code_block("```python\n#!/bin/bash\necho 1\n```")
                .unwrap()
                .language,
            "bash",
            "a shebang says what it is"
        );
        assert_eq!(
            code_block("```python\n#!/usr/bin/env python3\nprint(1)\n```")
                .unwrap()
                .language,
            "python"
        );
    }

    #[test]
    fn a_block_without_a_language_is_python_the_sandbox_may_find_is_not_code() {
        assert_eq!(
            code_block("```\nprint(open('/workspace/a').read())\n```"),
            Some(Block {
                language: "python".into(),
                code: "print(open('/workspace/a').read())".into(),
                untagged: true,
            })
        );
        assert_eq!(
            code_block(
                "```\nNameError: name 'x' is not defined\n```\nFixed:\n```python\nx = 1\n```"
            ),
            tagged("python", "x = 1"),
            "a tagged block after a quoted error is the one run"
        );
        assert_eq!(
            code_block("```\n#!/bin/sh\nls /workspace\n```"),
            tagged("bash", "#!/bin/sh\nls /workspace"),
            "a shebang names the shell"
        );
        assert_eq!(
            code_block("```text\n42\n```"),
            None,
            "another language's block"
        );
    }

    #[test]
    fn an_answer_set_out_in_a_bare_block_is_taken_out_of_it() {
        assert_eq!(answer_in("  ```\n42\n```\n"), "42");
        assert_eq!(answer_in("```python\n3.0\n```"), "3.0");
        assert_eq!(
            answer_in("```python print\n3.0\n```"),
            "```python print\n3.0\n```"
        );
        assert_eq!(answer_in("It is 42."), "It is 42.");
        assert_eq!(
            answer_in("```\na\n```\nand\n```\nb\n```"),
            "```\na\n```\nand\n```\nb\n```"
        );
    }

    #[test]
    fn a_reply_without_a_fence_that_begins_as_python_is_a_bare_block() {
        let bare = |code: &str| {
            Some(Block {
                language: "python".into(),
                code: code.into(),
                untagged: true,
            })
        };
        assert_eq!(
            unfenced_code("print(30 + 4321)\n"),
            bare("print(30 + 4321)")
        );
        assert_eq!(
            unfenced_code("import math\nprint(math.pi)"),
            bare("import math\nprint(math.pi)")
        );
        assert_eq!(
            unfenced_code("from os import sep"),
            bare("from os import sep")
        );
        assert_eq!(unfenced_code("The answer is 4351."), None);
        assert_eq!(unfenced_code("4351"), None);
        assert_eq!(unfenced_code(""), None);
        assert_eq!(
            unfenced_code("print(1)\n```python\nprint(2)\n```"),
            None,
            "a reply with a fence is read by its blocks"
        );
    }
}
