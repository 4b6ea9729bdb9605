//! The tools a prompt loop tells THINK of. Every tool on offer is a line
//! of the loop's system text (its Python signature, so a small model sees
//! the argument names and their order), and a model with a small context
//! (the local one: a few thousand tokens) cannot take them all and still
//! have room for the task, the code and its output. So the list is ranked
//! for the task's prompt, kept within a share of the model's context, and
//! says how many tools it leaves out and how code finds them
//! (`tools.search`). A small model is told only of the tools the prompt
//! names, by their own names or their servers': it reads every line it is
//! given at tens of tokens a second, and calls a listed tool where plain
//! Python would do.

use crate::identity::Principal;

/// Share of the model's context the tool list may take: the rest is the
/// loop's instructions, the task, the code THINK writes and what it prints,
/// over several iterations.
const CONTEXT_SHARE: u64 = 4;
/// Characters a token stands for, roughly (as the THINK queue estimates).
const CHARS_PER_TOKEN: u64 = 4;
/// A model with at most this many tokens of context is told only of the
/// tools its prompt names.
const SMALL_CONTEXT_TOKENS: u32 = 16_384;

/// The tools on offer ranked for a prompt: every tool's line, its Python
/// signature and summary (`tools.<server>.<tool>(path, head=None)  #
/// Read a file`).
#[derive(Debug, Default)]
pub struct Ranked {
    /// The tools the prompt names, the most relevant first.
    pub named: Vec<String>,
    /// The others.
    pub rest: Vec<String>,
}

/// Ranks the tools on offer to a task's owner for its prompt.
pub type Rank<'a> = dyn Fn(&str, Principal) -> Ranked + 'a;

/// The tools on offer, and how many of them a loop's THINK may be told of.
pub struct ToolMenu<'a> {
    rank: Box<Rank<'a>>,
    /// The most tokens the list may take; `None`: no limit.
    budget_tokens: Option<u64>,
    /// Whether only the tools the prompt names are listed.
    only_named: bool,
}

impl std::fmt::Debug for ToolMenu<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ToolMenu")
            .field("budget_tokens", &self.budget_tokens)
            .field("only_named", &self.only_named)
            .finish_non_exhaustive()
    }
}

impl<'a> ToolMenu<'a> {
    /// The tools `rank` orders, within a share of `context_tokens` (the
    /// model's context, when known; unknown: every tool is listed).
    pub fn new(rank: impl Fn(&str, Principal) -> Ranked + 'a, context_tokens: Option<u32>) -> Self {
        ToolMenu {
            rank: Box::new(rank),
            budget_tokens: context_tokens.map(|tokens| u64::from(tokens) / CONTEXT_SHARE),
            only_named: context_tokens.is_some_and(|tokens| tokens <= SMALL_CONTEXT_TOKENS),
        }
    }

    /// No tools at all (no prompt loop is starting).
    #[cfg(test)]
    pub fn empty() -> ToolMenu<'static> {
        ToolMenu {
            rank: Box::new(|_, _| Ranked::default()),
            budget_tokens: None,
            only_named: false,
        }
    }

    /// The list for a loop whose task is `prompt`, run as `owner`: the
    /// most relevant tools it may call that fit, a line each, then a line
    /// saying how many were left out.
    pub fn for_prompt(&self, prompt: &str, owner: Principal) -> String {
        let Ranked { named, rest } = (self.rank)(prompt, owner);
        let total = named.len() + rest.len();
        let candidates = if self.only_named {
            named
        } else {
            named.into_iter().chain(rest).collect()
        };
        let mut listed = Vec::new();
        let mut tokens = 0u64;
        for line in candidates {
            let cost = (line.len() as u64 + 1).div_ceil(CHARS_PER_TOKEN);
            if self
                .budget_tokens
                .is_some_and(|budget| tokens + cost > budget)
            {
                break;
            }
            tokens += cost;
            listed.push(line);
        }
        if listed.is_empty() && self.only_named {
            return String::new();
        }
        let left_out = total - listed.len();
        if left_out > 0 {
            log::debug!(
                "prompt loop: {} of {total} tools listed, {left_out} left out",
                listed.len()
            );
            listed.push(format!(
                "({left_out} more tools are not listed here; `tools.search(\"words\")` finds them.)"
            ));
        }
        listed.join("\n")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const OPERATOR: Principal = Principal::Operator { uid: 0 };

    fn lines(count: usize) -> Vec<String> {
        (0..count)
            .map(|i| format!("tools.s.tool{i:02}(a)  # does thing number {i}"))
            .collect()
    }

    /// `count` tools, the first `named` of them matched by the prompt.
    fn ranked(count: usize, named: usize) -> Ranked {
        let mut rest = lines(count);
        let named = rest.drain(..named).collect();
        Ranked { named, rest }
    }

    #[test]
    fn every_tool_is_listed_when_the_context_is_unknown() {
        let menu = ToolMenu::new(|_, _| ranked(40, 3), None);
        let listed = menu.for_prompt("anything", OPERATOR);
        assert_eq!(listed.lines().count(), 40);
        assert!(!listed.contains("not listed"), "{listed}");
    }

    #[test]
    fn a_small_context_lists_the_best_tools_and_counts_the_rest() {
        // A quarter of 2048 tokens is 512; a line of 40 or 41 characters
        // (with its newline) costs 11 tokens: 46 lines fit.
        let menu = ToolMenu::new(|_, _| ranked(100, 60), Some(2048));
        let listed = menu.for_prompt("anything", OPERATOR);
        let tools: Vec<&str> = listed.lines().filter(|l| l.starts_with("tools.")).collect();
        assert_eq!(tools.len(), 46, "{listed}");
        assert_eq!(tools[0], lines(1)[0], "the best first");
        assert!(
            listed.ends_with(
                "(54 more tools are not listed here; `tools.search(\"words\")` finds them.)"
            ),
            "{listed}"
        );
        let characters: usize = tools.iter().map(|l| l.len() + 1).sum();
        assert!(characters as u64 <= 512 * CHARS_PER_TOKEN, "{characters}");
    }

    #[test]
    fn a_small_model_is_told_only_of_the_tools_its_prompt_names() {
        let menu = ToolMenu::new(|_, _| ranked(30, 2), Some(8192));
        assert_eq!(
            menu.for_prompt("anything", OPERATOR),
            format!(
                "{}\n{}\n(28 more tools are not listed here; `tools.search(\"words\")` finds them.)",
                lines(1)[0],
                lines(2)[1]
            )
        );
        let none = ToolMenu::new(|_, _| ranked(30, 0), Some(8192));
        assert_eq!(
            none.for_prompt("anything", OPERATOR),
            "",
            "none named: none mentioned"
        );
        // A large context lists the others too, after the named ones.
        let large = ToolMenu::new(|_, _| ranked(30, 2), Some(128_000));
        assert_eq!(large.for_prompt("anything", OPERATOR).lines().count(), 30);
    }

    #[test]
    fn the_ranking_sees_the_prompt() {
        let menu = ToolMenu::new(
            |prompt: &str, _| Ranked {
                named: vec![format!("tools.s.first(what)  # for {prompt}")],
                rest: Vec::new(),
            },
            Some(8192),
        );
        assert_eq!(
            menu.for_prompt("time", OPERATOR),
            "tools.s.first(what)  # for time"
        );
    }
}
