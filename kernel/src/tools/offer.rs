//! The tools on offer, as one list for everything that shows them: TOOL's
//! `list` and `search`, the `tools` package EXEC runs import, and what the
//! prompt loop tells THINK. Each tool comes with the name code in a run
//! calls it by, unique within its server, so all three always agree.

use std::collections::{HashMap, HashSet};

use super::builtin;
use super::mcp::client::ToolInfo;
use super::search::{named_in_prompt, search, Searchable};
use super::servers::Servers;
use super::signature::{returns, Signature};
use crate::python_names::python_name;

/// Whose tools a list holds, besides the built-ins.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Listing {
    /// The servers a call reaches now: the ready ones.
    Ready,
    /// Every running server's tools as last listed, one restarting
    /// included: what code that imports `tools` keeps across a restart.
    Known,
}

/// A tool on offer.
#[derive(Clone, Debug)]
pub struct Offered<'a> {
    /// Its server.
    pub server: &'a str,
    /// The tool, as its server describes it.
    pub tool: &'a ToolInfo,
    /// Its name in Python: `tools.<server>.<python>(...)`; [`call`] gives its
    /// signature too.
    pub python: String,
}

/// The indices of the tools in `on_offer` that match `query`, best first,
/// at most `limit` (ranked as [`search`] does).
pub fn ranked(on_offer: &[Offered<'_>], query: &str, limit: usize) -> Vec<usize> {
    search(&searchable(on_offer), query, limit)
}

fn searchable<'a>(on_offer: &'a [Offered<'_>]) -> Vec<Searchable<'a>> {
    on_offer
        .iter()
        .map(|offered| Searchable {
            server: offered.server,
            name: &offered.tool.name,
            description: &offered.tool.description,
        })
        .collect()
}

/// The indices of the tools in `on_offer` that a task's `prompt` names,
/// best first (see [`named_in_prompt`]).
pub fn named_in(on_offer: &[Offered<'_>], prompt: &str) -> Vec<usize> {
    named_in_prompt(&searchable(on_offer), prompt)
}

/// The built-ins, then the servers' tools `listing` names, in order.
pub fn offered(servers: &Servers, listing: Listing) -> Vec<Offered<'_>> {
    let listed: Vec<(&str, &ToolInfo)> = match listing {
        Listing::Ready => servers.tools().collect(),
        Listing::Known => servers.known_tools().collect(),
    };
    let tools = builtin::tools()
        .iter()
        .map(|(server, tool)| (*server, tool))
        .chain(listed);
    name_for_python(tools)
}

/// Names each tool for Python, none twice within a server and none taken
/// by what every server's namespace has (`get-sum` is `get_sum`; a second
/// `get_sum`, `get_sum_2`).
pub fn name_for_python<'a>(
    tools: impl IntoIterator<Item = (&'a str, &'a ToolInfo)>,
) -> Vec<Offered<'a>> {
    let mut taken: HashMap<&str, HashSet<String>> = HashMap::new();
    tools
        .into_iter()
        .map(|(server, tool)| {
            let taken = taken.entry(server).or_default();
            let base = python_name(&tool.name);
            let mut python = base.clone();
            let mut n = 1;
            while python.starts_with("__") || !taken.insert(python.clone()) {
                n += 1;
                python = format!("{base}_{n}");
            }
            Offered {
                server,
                tool,
                python,
            }
        })
        .collect()
}

/// How code calls the tool: `tools.<server>.<python>(path, head=None)`.
pub fn call(offered: &Offered<'_>) -> String {
    format!(
        "tools.{}.{}{}",
        offered.server,
        offered.python,
        Signature::of(&offered.tool.input_schema).render()
    )
}

/// One line per tool, as code calls it, with what it returns when its
/// result is structured and the first sentence of its description as a
/// Python comment: `tools.filesystem.read_text_file(path, head=None) ->
/// str  # Read a file.`.
pub fn summary(offered: &[Offered<'_>]) -> String {
    offered
        .iter()
        .map(|offered| {
            let mut line = call(offered);
            if let Some(returns) = offered.tool.output_schema.as_ref().and_then(returns) {
                line.push_str(&format!(" -> {returns}"));
            }
            let summary = first_sentence(&offered.tool.description);
            if !summary.is_empty() {
                line.push_str(&format!("  # {summary}"));
            }
            line
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The first sentence of a description's first line: a server's
/// descriptions run to paragraphs, and a loop's model reads every word.
fn first_sentence(description: &str) -> &str {
    let line = description.lines().next().unwrap_or("").trim();
    match line.find(". ") {
        Some(end) => &line[..=end],
        None => line,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tool(name: &str) -> ToolInfo {
        ToolInfo {
            name: name.into(),
            description: format!("Does {name}.\nMore."),
            input_schema: serde_json::json!({"type": "object"}),
            output_schema: None,
        }
    }

    #[test]
    fn colliding_names_get_the_same_python_name_everywhere_they_are_shown() {
        let (sum, same, import, other) = (
            tool("get-sum"),
            tool("get_sum"),
            tool("import"),
            tool("get_sum"),
        );
        let offered = name_for_python([
            ("everything", &sum),
            ("everything", &same),
            ("everything", &import),
            ("other", &other),
        ]);
        let names: Vec<&str> = offered.iter().map(|o| o.python.as_str()).collect();
        assert_eq!(names, ["get_sum", "get_sum_2", "import_", "get_sum"]);
        let summary = summary(&offered);
        assert_eq!(
            summary.lines().nth(1),
            Some("tools.everything.get_sum_2()  # Does get_sum.")
        );
    }

    #[test]
    fn a_tool_is_summed_up_by_its_first_sentence() {
        assert_eq!(
            first_sentence("Read a file as text. Handles encodings. Use head=N.\nMore."),
            "Read a file as text."
        );
        assert_eq!(
            first_sentence("  No full stop here\nMore"),
            "No full stop here"
        );
        assert_eq!(first_sentence(""), "");
    }
}
