//! Names as Python knows them: tools and servers become attributes of the
//! `tools` package inside EXEC, so their names must be identifiers.

/// A name as a Python identifier: every character that may not be in one
/// becomes `_` (`get-sum` → `get_sum`); a leading digit or a Python
/// keyword gets a `_` more (`2fa` → `_2fa`, `import` → `import_`).
pub fn python_name(name: &str) -> String {
    let mut out: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if out.is_empty() || out.starts_with(|c: char| c.is_ascii_digit()) {
        out.insert(0, '_');
    }
    if is_keyword(&out) {
        out.push('_');
    }
    out
}

/// Python's keywords: no name may be one.
const HARD_KEYWORDS: [&str; 35] = [
    "False", "None", "True", "and", "as", "assert", "async", "await", "break", "class", "continue",
    "def", "del", "elif", "else", "except", "finally", "for", "from", "global", "if", "import",
    "in", "is", "lambda", "nonlocal", "not", "or", "pass", "raise", "return", "try", "while",
    "with", "yield",
];
/// Python's soft keywords: valid names (a parameter may be called `type`),
/// but kept off attributes so a tool never reads as syntax.
const SOFT_KEYWORDS: [&str; 3] = ["match", "case", "type"];

/// Whether `name` is one of Python's keywords, soft ones included.
pub fn is_keyword(name: &str) -> bool {
    HARD_KEYWORDS.contains(&name) || SOFT_KEYWORDS.contains(&name)
}

/// Whether `name` can be a Python function's parameter, so an argument
/// can be passed by position or as `name=`: an identifier (as
/// `str.isidentifier` has it, near enough) that is not a hard keyword.
pub fn is_parameter_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|first| first == '_' || first.is_alphabetic())
        && chars.all(|c| c == '_' || c.is_alphanumeric())
        && !HARD_KEYWORDS.contains(&name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_become_identifiers() {
        assert_eq!(python_name("get-sum"), "get_sum");
        assert_eq!(python_name("read.file v2"), "read_file_v2");
    }

    #[test]
    fn parameter_names_are_identifiers_but_not_keywords() {
        assert!(is_parameter_name("path") && is_parameter_name("type"));
        assert!(!is_parameter_name("from") && !is_parameter_name("max-tokens"));
    }

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
}
