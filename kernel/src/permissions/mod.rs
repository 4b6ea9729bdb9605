//! What a principal may be given, in the terms every subsystem checks it
//! by: tool patterns (`permissions.tools`: which tools a caller may see and
//! call, and whether a child's patterns stay within its parent's) and token
//! budgets (`permissions.llm_tokens`), and the allowances of a principal's
//! THINK quota a node leases ([`allowance`]). Kept below the subsystems,
//! so the agents, THINK, the tools, the fleet and the kernel share them
//! without reaching into each other.

pub mod allowance;

use agentos_proto::{ErrorCode, ErrorReply};

/// A token budget: `tokens` set on agent `owner`, shared by it and every
/// agent it spawned, directly or not.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Budget {
    /// The agent whose `permissions.llm_tokens` set it.
    pub owner: u32,
    /// Its size.
    pub tokens: u64,
}

/// The refusal of an EXEC request that asks, in `field`, for more than
/// its caller has.
pub fn beyond_caller(field: &str, why: &str) -> ErrorReply {
    ErrorReply::new(
        ErrorCode::PermissionDenied,
        format!("EXEC field `{field}`: {why} (a run never gets more than its caller)"),
    )
}

/// Whether `server.tool` is within a `permissions.tools` pattern: `*`
/// stands for any run of characters (`"*"`, `"everything.*"`,
/// `"*.read_file"`); anything else must match exactly.
pub fn allowed(pattern: &str, server: &str, tool: &str) -> bool {
    glob(pattern.as_bytes(), format!("{server}.{tool}").as_bytes())
}

/// Whether any of `patterns` allows `server.tool`.
pub fn allowed_by(patterns: &[String], server: &str, tool: &str) -> bool {
    patterns.iter().any(|p| allowed(p, server, tool))
}

/// Whether any of `patterns` allows some tool of `server`: a caller learns
/// of a server (its state, why it failed) only if it could call one of its
/// tools. A pattern allows some `server.<tool>` exactly when a prefix of it
/// matches `server.`: the rest of the pattern spells a tool (a prefix
/// ending in `*` stands for a `*` that spans the dot).
pub fn allows_server(patterns: &[String], server: &str) -> bool {
    let text = format!("{server}.");
    patterns.iter().any(|p| {
        (0..=p.len())
            .filter(|&end| p.is_char_boundary(end))
            .any(|end| glob(&p.as_bytes()[..end], text.as_bytes()))
    })
}

/// Whether every `server.tool` that `pattern` allows is allowed by one of
/// `patterns` too (a child's pattern against its parent's): `pattern` read
/// as plain text must match one of them, its own `*`s taken by theirs.
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pattern_allows_what_it_names() {
        assert!(allowed("everything.*", "everything", "echo"));
        assert!(!allowed("everything.*", "filesystem", "read_file"));
    }

    #[test]
    fn a_server_is_allowed_when_a_pattern_allows_any_of_its_tools() {
        let allows = |pattern: &str, server: &str| allows_server(&[pattern.to_owned()], server);
        for pattern in [
            "*",
            "time.*",
            "time.get_current_time",
            "ti*",
            "*.now",
            "t*e.x",
        ] {
            assert!(allows(pattern, "time"), "{pattern}");
        }
        for pattern in ["everything.*", "time", "timer.*", "times*.x", "x*"] {
            assert!(!allows(pattern, "time"), "{pattern}");
        }
        assert!(!allows_server(&[], "time"));
    }

    #[test]
    fn a_childs_pattern_is_covered_by_its_parents() {
        let parent = ["everything.*".to_owned()];
        assert!(covered_by(&parent, "everything.get-*"));
        assert!(!covered_by(&parent, "*"));
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
}
