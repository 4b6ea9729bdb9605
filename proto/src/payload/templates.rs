//! EXEC's templates: a named, read-only Python environment built once
//! (`build_template`, from packages or a requirements file, by pip in a
//! sandbox whose network is the package index alone) and mounted into
//! every run and session started from it (`"template": "NAME"`).
//!
//! What may be asked of pip is checked here, before anything runs: named
//! packages from the configured index, never another index, a URL, a path
//! or an editable install.

use serde::{Deserialize, Serialize};

use super::parse::bad_request;
use crate::error::ErrorReply;

/// Most packages a build may name.
pub const MAX_TEMPLATE_PACKAGES: usize = 256;
/// Largest requirements text a build may bring, in bytes.
pub const MAX_REQUIREMENTS_BYTES: usize = 64 << 10;

/// pip options a requirements line may carry: they change how the named
/// packages are chosen, never where they come from.
const ALLOWED_OPTIONS: [&str; 5] = [
    "--hash",
    "--require-hashes",
    "--only-binary",
    "--prefer-binary",
    "--no-binary",
];

/// Why a package or a requirements line is refused.
#[derive(Clone, Debug, PartialEq, Eq)]
struct NotAllowed(String);

impl std::fmt::Display for NotAllowed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// One template, as `templates` lists it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct TemplateInfo {
    /// Its name.
    pub template: String,
    /// When it was built (RFC 3339).
    pub created_at: String,
    /// Bytes its disk takes on the host.
    pub bytes: u64,
    /// Built by an operator: every principal may use it. Else it is its
    /// builder's own.
    pub shared: bool,
    /// What it was built from: the packages named, then the requirements
    /// text's requirement lines.
    pub packages: Vec<String>,
}

/// The reply to `{"op":"templates"}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct TemplatesReply {
    /// Always true.
    pub success: bool,
    /// The templates the caller may use, its own first.
    pub templates: Vec<TemplateInfo>,
}

/// The reply to `{"op":"remove_template"}`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct TemplateRemovedReply {
    /// Always true.
    pub success: bool,
    /// Whether there was one.
    pub removed: bool,
}

/// Checks what a `build_template` asks pip for: packages, or a
/// requirements text, or both.
pub(crate) fn check_build(
    packages: &[String],
    requirements: Option<&str>,
) -> Result<(), ErrorReply> {
    if packages.is_empty() && requirements.is_none() {
        return Err(bad_request(
            "EXEC op `build_template` needs `packages` or `requirements`",
        ));
    }
    check_packages(packages)?;
    requirements.map_or(Ok(()), check_requirements)
}

/// Checks the packages a build names: each a requirement specifier
/// (`pandas`, `numpy>=2`, `requests[socks]==2.32.3`), nothing pip would
/// read as an option, a URL or a path.
pub fn check_packages(packages: &[String]) -> Result<(), ErrorReply> {
    if packages.len() > MAX_TEMPLATE_PACKAGES {
        return Err(bad_request(format!(
            "EXEC field `packages` names {} packages, more than {MAX_TEMPLATE_PACKAGES}",
            packages.len()
        )));
    }
    for package in packages {
        check_specifier(package).map_err(|why| {
            bad_request(format!(
                "EXEC field `packages`: {package:?} is refused: {why}"
            ))
        })?;
    }
    Ok(())
}

/// Checks a requirements text line by line: requirement specifiers, with
/// the options in [`ALLOWED_OPTIONS`]; an index (`--index-url`,
/// `--extra-index-url`, `--find-links`), an editable install (`-e`), an
/// included file (`-r`, `-c`), a URL or a path is refused, naming the line.
pub fn check_requirements(text: &str) -> Result<(), ErrorReply> {
    if text.len() > MAX_REQUIREMENTS_BYTES {
        return Err(bad_request(format!(
            "EXEC field `requirements` is {} bytes, more than {MAX_REQUIREMENTS_BYTES}",
            text.len()
        )));
    }
    for (number, line) in logical_lines(text) {
        check_requirement_line(&line).map_err(|why| {
            bad_request(format!(
                "EXEC field `requirements`, line {number}: {why}: {:?}",
                line.trim()
            ))
        })?;
    }
    Ok(())
}

/// The requirement lines of a requirements text (comments and empty lines
/// left out, continuations joined), for a template's record.
pub fn requirement_lines(text: &str) -> Vec<String> {
    logical_lines(text)
        .map(|(_, line)| {
            line.split_whitespace()
                .next()
                .unwrap_or_default()
                .to_owned()
        })
        .filter(|first| !first.is_empty() && !first.starts_with('-'))
        .collect()
}

/// The text's lines as pip reads them: a trailing `\` joins the next, a
/// `#` after whitespace (or at the start) begins a comment. Each with the
/// number of its first line.
fn logical_lines(text: &str) -> impl Iterator<Item = (usize, String)> + '_ {
    let mut lines = text.lines().enumerate().peekable();
    std::iter::from_fn(move || loop {
        let (index, first) = lines.next()?;
        let mut line = first.to_owned();
        while line.ends_with('\\') {
            line.pop();
            match lines.next() {
                Some((_, next)) => line.push_str(next),
                None => break,
            }
        }
        let line = strip_comment(&line);
        if !line.trim().is_empty() {
            return Some((index + 1, line));
        }
    })
}

fn strip_comment(line: &str) -> String {
    let mut previous = ' ';
    for (at, c) in line.char_indices() {
        if c == '#' && previous.is_whitespace() {
            return line[..at].to_owned();
        }
        previous = c;
    }
    line.to_owned()
}

fn check_requirement_line(line: &str) -> Result<(), NotAllowed> {
    let mut words = line.split_whitespace();
    let first = words.next().unwrap_or_default();
    if first.starts_with('-') {
        check_option(first)?;
        return Ok(());
    }
    // The specifier runs up to its options; a marker (`; python_version <
    // "3.12"`) may hold spaces.
    let specifier = line.split(" -").next().unwrap_or_default();
    check_specifier(specifier.trim())?;
    for word in line[specifier.len()..].split_whitespace() {
        if word.starts_with('-') {
            check_option(word)?;
        }
    }
    Ok(())
}

fn check_option(word: &str) -> Result<(), NotAllowed> {
    let name = word.split('=').next().unwrap_or_default();
    if ALLOWED_OPTIONS.contains(&name) {
        return Ok(());
    }
    let what = match name {
        "-e" | "--editable" => "an editable install",
        "-i" | "--index-url" | "--extra-index-url" | "--no-index" => {
            "another index (the build uses the configured one)"
        }
        "-f" | "--find-links" | "--trusted-host" => "another source of packages",
        "-r" | "--requirement" | "-c" | "--constraint" => "an included file",
        _ => "a pip option a build may not set",
    };
    Err(NotAllowed(format!("{name} is refused: {what}")))
}

fn check_specifier(specifier: &str) -> Result<(), NotAllowed> {
    if specifier.starts_with('-') {
        let option = specifier.split_whitespace().next().unwrap_or_default();
        return check_option(option).and(Err(NotAllowed(format!(
            "{option} is an option, not a package"
        ))));
    }
    let name_start = specifier.chars().next();
    if !name_start.is_some_and(|c| c.is_ascii_alphanumeric()) {
        return Err(NotAllowed(
            "a requirement starts with a package's name".into(),
        ));
    }
    if specifier.contains("://") || specifier.contains('@') {
        return Err(NotAllowed(
            "a URL or direct reference is refused: name a package from the index".into(),
        ));
    }
    if let Some(bad) = specifier.chars().find(|c| {
        !(c.is_ascii_alphanumeric()
            || matches!(
                c,
                '.' | '_'
                    | '-'
                    | '['
                    | ']'
                    | ','
                    | '<'
                    | '>'
                    | '='
                    | '!'
                    | '~'
                    | '*'
                    | ';'
                    | ' '
                    | '"'
                    | '\''
                    | '('
                    | ')'
            ))
    }) {
        return Err(NotAllowed(format!(
            "{bad:?} has no place in a requirement (a path?)"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packages_by_name_and_version_pass() {
        let ok = [
            "pandas",
            "numpy>=2,<3",
            "requests[socks]==2.32.3",
            "six ; python_version < \"4\"",
        ];
        check_packages(&ok.map(String::from)).unwrap();
    }

    #[test]
    fn options_urls_and_paths_are_refused_by_name() {
        for (bad, said) in [
            ("-e .", "editable"),
            ("--index-url=https://evil.example/simple", "another index"),
            ("git+https://example.com/x.git", "URL"),
            ("pkg @ https://example.com/pkg.whl", "URL"),
            ("./local", "starts with a package"),
            ("/abs/path", "starts with a package"),
            ("pkg/../x", "has no place"),
        ] {
            let err = check_packages(&[bad.to_owned()]).unwrap_err();
            assert!(err.error.contains(said), "{bad}: {}", err.error);
        }
    }

    #[test]
    fn a_requirements_file_is_read_as_pip_reads_it() {
        let text = "# pinned\nnumpy==2.1.0 \\\n    --hash=sha256:aa \\\n    --hash=sha256:bb\n\n\
                    pandas==2.2.3  # comment\n--require-hashes\n";
        check_requirements(text).unwrap();
        assert_eq!(requirement_lines(text), ["numpy==2.1.0", "pandas==2.2.3"]);
        for (bad, said) in [
            (
                "numpy\n-i https://evil.example/simple\n",
                "line 2: -i is refused: another index",
            ),
            ("--extra-index-url https://x\n", "another index"),
            ("-r other.txt\n", "an included file"),
            ("numpy --trusted-host x\n", "another source"),
            ("-e git+https://x\n", "editable"),
        ] {
            let err = check_requirements(bad).unwrap_err();
            assert!(err.error.contains(said), "{bad:?}: {}", err.error);
        }
    }
}
