//! What the tools are called and how they are found: Python names for
//! code in EXEC, the `permissions.tools` patterns agents are given, and
//! the ranking of a TOOL search.

pub use crate::python_names::python_name;

/// Whether `server.tool` is within a `permissions.tools` pattern: `*`
/// stands for any run of characters (`"*"`, `"everything.*"`,
/// `"*.read_file"`); anything else must match exactly.
///
/// ```
/// use agentos_kernel::tools::catalog::allowed;
/// assert!(allowed("everything.*", "everything", "echo"));
/// assert!(!allowed("everything.*", "filesystem", "read_file"));
/// ```
pub fn allowed(pattern: &str, server: &str, tool: &str) -> bool {
    glob(pattern.as_bytes(), format!("{server}.{tool}").as_bytes())
}

/// Whether any of `patterns` allows `server.tool`.
pub fn allowed_by(patterns: &[String], server: &str, tool: &str) -> bool {
    patterns.iter().any(|p| allowed(p, server, tool))
}

/// Whether every `server.tool` that `pattern` allows is allowed by one of
/// `patterns` too (a child's pattern against its parent's): `pattern` read
/// as plain text must match one of them, its own `*`s taken by theirs.
///
/// ```
/// use agentos_kernel::tools::catalog::covered_by;
/// let parent = ["everything.*".to_owned()];
/// assert!(covered_by(&parent, "everything.get-*"));
/// assert!(!covered_by(&parent, "*"));
/// ```
pub fn covered_by(patterns: &[String], pattern: &str) -> bool {
    patterns
        .iter()
        .any(|p| glob(p.as_bytes(), pattern.as_bytes()))
}

/// `*`-only glob matching, iterative (no backtracking blow-up).
fn glob(pattern: &[u8], text: &[u8]) -> bool {
    let (mut p, mut t) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while t < text.len() {
        if p < pattern.len() && pattern[p] == b'*' {
            star = Some((p, t));
            p += 1;
        } else if p < pattern.len() && pattern[p] == text[t] {
            p += 1;
            t += 1;
        } else if let Some((star_p, star_t)) = star {
            p = star_p + 1;
            t = star_t + 1;
            star = Some((star_p, star_t + 1));
        } else {
            return false;
        }
    }
    pattern[p..].iter().all(|c| *c == b'*')
}

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

    #[test]
    fn names_become_python_identifiers() {
        for (name, python) in [
            ("echo", "echo"),
            ("get-sum", "get_sum"),
            ("read_text_file", "read_text_file"),
            ("a.b/c d", "a_b_c_d"),
            ("2fa", "_2fa"),
            ("import", "import_"),
            ("", "_"),
            ("héllo", "h_llo"),
        ] {
            assert_eq!(python_name(name), python, "{name:?}");
        }
    }

    #[test]
    fn patterns_allow_what_they_say_and_nothing_more() {
        for (pattern, server, tool, allowed_here) in [
            ("*", "everything", "echo", true),
            ("everything.*", "everything", "echo", true),
            ("everything.*", "everything2", "echo", false),
            ("everything.echo", "everything", "echo", true),
            ("everything.echo", "everything", "echo2", false),
            ("*.read_file", "filesystem", "read_file", true),
            ("*.read_file", "filesystem", "write_file", false),
            ("file*.*file", "filesystem", "read_file", true),
            ("fs*.*file", "filesystem", "read_file", false),
            ("", "a", "b", false),
            ("llm.think", "llm", "think", true),
        ] {
            assert_eq!(
                allowed(pattern, server, tool),
                allowed_here,
                "{pattern} vs {server}.{tool}"
            );
        }
        // A pattern of many stars against a long name stays quick.
        let long = "a".repeat(10_000);
        assert!(!allowed(&"*a".repeat(50).replace("a", "b"), "s", &long));
        assert!(allowed_by(
            &["x.*".into(), "kernel.*".into()],
            "kernel",
            "list_agents"
        ));
        assert!(!allowed_by(&[], "kernel", "list_agents"));
    }

    #[test]
    fn a_search_ranks_names_above_descriptions_and_leaves_out_the_rest() {
        let tools = [
            Searchable {
                server: "filesystem",
                name: "read_text_file",
                description: "Read the complete contents of a file as text",
            },
            Searchable {
                server: "filesystem",
                name: "write_file",
                description: "Create a new file or overwrite an existing one",
            },
            Searchable {
                server: "everything",
                name: "echo",
                description: "Echoes back the input",
            },
            Searchable {
                server: "filesystem",
                name: "list_directory",
                description: "Get a listing of files, reading the directory",
            },
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
}
