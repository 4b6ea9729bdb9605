//! Names as Python knows them: tools and servers become attributes of the
//! `tools` package inside EXEC, so their names must be identifiers.

/// A name as a Python identifier: every character that may not be in one
/// becomes `_` (`get-sum` → `get_sum`); a leading digit or a Python
/// keyword gets a `_` more (`2fa` → `_2fa`, `import` → `import_`).
///
/// ```
/// use agentos_kernel::python_names::python_name;
/// assert_eq!(python_name("get-sum"), "get_sum");
/// assert_eq!(python_name("read.file v2"), "read_file_v2");
/// ```
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

/// Python's keywords, soft ones included.
const KEYWORDS: [&str; 38] = [
    "False", "None", "True", "and", "as", "assert", "async", "await", "break", "class", "continue",
    "def", "del", "elif", "else", "except", "finally", "for", "from", "global", "if", "import",
    "in", "is", "lambda", "nonlocal", "not", "or", "pass", "raise", "return", "try", "while",
    "with", "yield", "match", "case", "type",
];

/// Whether `name` is one of Python's keywords.
pub fn is_keyword(name: &str) -> bool {
    KEYWORDS.contains(&name)
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
}
