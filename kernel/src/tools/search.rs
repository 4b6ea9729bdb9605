//! The ranking of a TOOL search.

use std::collections::HashSet;

/// A tool as a search sees it.
#[derive(Clone, Copy, Debug)]
pub struct Searchable<'a> {
    /// Its server.
    pub server: &'a str,
    /// Its name.
    pub name: &'a str,
    /// Its description.
    pub description: &'a str,
}

/// The indices of the tools matching `query`, best first, at most
/// `limit`. Each word of the query scores where it is found: a whole word
/// of the tool's name counts most, part of its name or its server's name
/// less, a word of its description least (a word of four letters or more
/// also matches words it begins, so `read` finds `reading`). Tools that
/// match no word are left out; ties keep server and name order.
pub fn search(tools: &[Searchable<'_>], query: &str, limit: usize) -> Vec<usize> {
    let wanted = words(query);
    let mut scored: Vec<(u32, usize)> = tools
        .iter()
        .enumerate()
        .filter_map(|(index, tool)| {
            let score = score(tool, &wanted);
            (score > 0).then_some((score, index))
        })
        .collect();
    scored.sort_by(|(a_score, a), (b_score, b)| {
        b_score.cmp(a_score).then_with(|| {
            (tools[*a].server, tools[*a].name).cmp(&(tools[*b].server, tools[*b].name))
        })
    });
    scored
        .into_iter()
        .take(limit)
        .map(|(_, index)| index)
        .collect()
}

fn score(tool: &Searchable<'_>, wanted: &[String]) -> u32 {
    let name_words = words(tool.name);
    let description_words = words(tool.description);
    let name = tool.name.to_ascii_lowercase();
    let server = tool.server.to_ascii_lowercase();
    wanted
        .iter()
        .map(|word| {
            if name_words.iter().any(|w| same(w, word)) {
                6
            } else if name.contains(word.as_str()) || server.contains(word.as_str()) {
                3
            } else if description_words.iter().any(|w| same(w, word)) {
                1
            } else {
                0
            }
        })
        .sum()
}

/// Bytes of a task's prompt read for the tools it names: a task says what
/// it needs near its start.
const PROMPT_READ_BYTES: usize = 16 * 1024;

/// The tools a task's prompt names, best first: those whose own name it
/// has (`get-sum`, `get_sum` or `get sum`), then every tool of each server
/// it names without naming one of that server's tools (a task that says
/// "the filesystem server's read_text_file" wants that tool, not fourteen
/// lines a small model reads at tens of tokens a second). A word shared
/// with a name or a description is not enough: a sentence about a file would otherwise list every tool with `file` in
/// its name, and a small model calls a listed tool where plain Python
/// would do. Only the prompt's first [`PROMPT_READ_BYTES`] are read: this
/// runs on the reactor, and a prompt may be a megabyte.
pub fn named_in_prompt(tools: &[Searchable<'_>], prompt: &str) -> Vec<usize> {
    let mut end = prompt.len().min(PROMPT_READ_BYTES);
    while !prompt.is_char_boundary(end) {
        end -= 1;
    }
    let said = words(&prompt[..end]);
    let says = |name: &str| {
        let name = words(name);
        !name.is_empty() && said.windows(name.len()).any(|window| window == name)
    };
    let by_name: Vec<bool> = tools.iter().map(|tool| says(tool.name)).collect();
    let with_a_tool_named: HashSet<&str> = tools
        .iter()
        .zip(&by_name)
        .filter(|(_, named)| **named)
        .map(|(tool, _)| tool.server)
        .collect();
    let mut named: Vec<(u8, usize)> = tools
        .iter()
        .enumerate()
        .filter_map(|(index, tool)| {
            let rank = if by_name[index] {
                0
            } else if !with_a_tool_named.contains(tool.server) && says(tool.server) {
                1
            } else {
                return None;
            };
            Some((rank, index))
        })
        .collect();
    named.sort_unstable();
    named.into_iter().map(|(_, index)| index).collect()
}

/// A word of the tool's matches a word of the query: the same, or begun
/// by a query word of four letters or more.
fn same(word: &str, wanted: &str) -> bool {
    word == wanted || (wanted.len() >= 4 && word.starts_with(wanted))
}

/// Lower-case words: runs of letters and digits.
fn words(text: &str) -> Vec<String> {
    text.split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(str::to_lowercase)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tool<'a>(server: &'a str, name: &'a str, description: &'a str) -> Searchable<'a> {
        Searchable {
            server,
            name,
            description,
        }
    }

    #[test]
    fn a_search_ranks_names_above_descriptions_and_leaves_out_the_rest() {
        let tools = [
            tool(
                "filesystem",
                "read_text_file",
                "Read the complete contents of a file as text",
            ),
            tool(
                "filesystem",
                "write_file",
                "Create a new file or overwrite an existing one",
            ),
            tool("everything", "echo", "Echoes back the input"),
            tool(
                "filesystem",
                "list_directory",
                "Get a listing of files, reading the directory",
            ),
        ];
        let found = search(&tools, "read file", 10);
        assert_eq!(
            found,
            vec![0, 1, 3],
            "read_text_file, then write_file, then a mention"
        );
        assert_eq!(search(&tools, "read file", 1), vec![0]);
        assert_eq!(search(&tools, "ECHO", 10), vec![2]);
        assert!(search(&tools, "weather", 10).is_empty());
        assert_eq!(
            search(&tools, "everything", 10),
            vec![2],
            "a server's name counts"
        );
    }

    #[test]
    fn a_prompt_names_tools_by_their_whole_names_or_their_servers() {
        let tools = [
            tool(
                "filesystem",
                "read_text_file",
                "Read the complete contents of a file as text",
            ),
            tool("everything", "get-sum", "Returns the sum of two numbers"),
            tool("time", "convert_time", "Convert time between timezones"),
        ];
        let named = |prompt: &str| named_in_prompt(&tools, prompt);
        assert!(
            named("Use Python to write the text to a file, then read the sum of its numbers")
                .is_empty(),
            "words of names and descriptions name nothing"
        );
        assert_eq!(
            named("Read notes.txt with the filesystem server's read_text_file tool"),
            vec![0]
        );
        let with_a_sibling = [
            tools[0],
            tool("filesystem", "write_file", "Write a file"),
            tools[1],
        ];
        assert_eq!(
            named_in_prompt(
                &with_a_sibling,
                "Read notes.txt with the filesystem server's read_text_file tool"
            ),
            vec![0],
            "a server's tool named leaves its other tools out"
        );
        assert_eq!(
            named_in_prompt(
                &with_a_sibling,
                "Use the filesystem server to read notes.txt"
            ),
            vec![0, 1],
            "a server named alone lists all its tools"
        );
        assert_eq!(named("Call the get-sum tool with a = 1 and b = 2"), vec![1]);
        assert_eq!(named("call get_sum"), vec![1]);
        assert_eq!(
            named("Use the time server to convert 12:00 in London to Tokyo"),
            vec![2],
            "a server named lists its tools"
        );
        assert_eq!(
            named("the filesystem server's tools, and the everything server's get-sum"),
            vec![1, 0],
            "a tool named comes before its server's others"
        );
        // The limit falls inside an é.
        let long = format!("x{} the time server", "é".repeat(PROMPT_READ_BYTES / 2));
        assert!(named(&long).is_empty(), "only the prompt's start is read");
        assert_eq!(named(&long[PROMPT_READ_BYTES + 1..]), vec![2]);
    }
}
