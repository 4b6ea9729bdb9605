//! The house rules, read from every crate of the workspace with `syn`.
//! Each failure names `file:line` and the rule; each rule is here because
//! breaking it once made the code harder to change:
//!
//! - **No source file over 700 lines** (tests aside). A file that long
//!   holds more than one concern, and the next change lands in it because
//!   it is there.
//! - **No `Result<_, String>` or `Box<dyn Error>`; `anyhow` only in a
//!   binary's main file.** A string error cannot be matched on, so callers
//!   parse it back — a field name split out of a message, an error code read
//!   from a suffix — and break when the wording changes.
//! - **No `json!` and no string-literal index into JSON** (`reply["x"]`)
//!   outside the allow-listed edge files. The wire crate's types are the
//!   contract; hand-built or hand-read JSON drifts from them without a
//!   compiler error.
//! - **No `thread::Builder` outside the threads module.** Every thread is
//!   named and logs its panic in one place; a thread spawned elsewhere dies
//!   silently.
//! - **A type's inherent `impl` lives in one file.** A type whose methods
//!   are spread over files is split by `impl`, not by what each part owns:
//!   its child files reach into its fields and call back into it, a cycle
//!   the import graph cannot see.
//! - **No import cycle between files or modules, in any crate** (the graph
//!   is printed, level by level, with `-- --nocapture`). The tree reads
//!   from the top down; a child that reaches back up makes both one module.
//!
//! Test code — test targets, and items under `#[cfg(test)]` — is exempt
//! from all but the cycle rule.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod graph;
mod rules;
mod workspace;

use std::collections::BTreeSet;
use std::fs;
use std::path::Path;
use std::sync::OnceLock;

use graph::{crate_cycles, file_graph, level_graph};
use rules::{check_file, impl_sites, ImplSites, Rule, Violation};
use workspace::crates;

/// Files allowed to break a rule, each with its reason. At most five, and
/// never for file size or untyped errors. An entry nothing needs any more
/// fails the test too.
const ALLOWED: &[(Rule, &str, &str)] = &[];

fn workspace_root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap()
}

/// Every violation of the rules in the workspace at `root`.
fn violations(root: &Path) -> Vec<Violation> {
    let crates = crates(root);
    let mut found = Vec::new();
    let mut sites = ImplSites::default();
    for krate in &crates {
        found.extend(krate.files.iter().flat_map(check_file));
        impl_sites(krate, &mut sites);
        found.extend(crate_cycles(&file_graph(&krate.files)));
    }
    found.extend(spread_impls(&sites));
    found.sort();
    found.dedup();
    found
}

/// A violation for each type whose inherent `impl` blocks stand in more
/// than one file, at each block outside its first file.
fn spread_impls(sites: &ImplSites) -> Vec<Violation> {
    let mut found = Vec::new();
    for (key, places) in &sites.blocks {
        let files: BTreeSet<&Path> = places.iter().map(|(path, _)| path.as_path()).collect();
        if files.len() < 2 {
            continue;
        }
        // Blocks beside the type's definition are at home; the rest are not.
        let home = sites
            .definitions
            .get(key)
            .cloned()
            .unwrap_or_else(|| places[0].0.clone());
        let ty = &key.1;
        let listed: Vec<String> = files.iter().map(|f| f.display().to_string()).collect();
        for (path, line) in places.iter().filter(|(path, _)| *path != home) {
            found.push(Violation {
                rule: Rule::ImplSpread,
                path: path.clone(),
                line: *line,
                detail: format!("`impl {ty}` stands in {}", listed.join(", ")),
            });
        }
    }
    found
}

/// The violations of `rule` not allowed, and the allow-list entries of
/// `rule` nothing needs.
fn unallowed(rule: Rule) -> Vec<String> {
    static FOUND: OnceLock<Vec<Violation>> = OnceLock::new();
    let all = FOUND.get_or_init(|| violations(workspace_root()));
    let mut problems: Vec<String> = all
        .iter()
        .filter(|v| v.rule == rule)
        .filter(|v| {
            !ALLOWED
                .iter()
                .any(|(r, path, _)| *r == rule && v.path == Path::new(path))
        })
        .map(ToString::to_string)
        .collect();
    for (_, path, _) in ALLOWED.iter().filter(|(r, _, _)| *r == rule) {
        if !all
            .iter()
            .any(|v| v.rule == rule && v.path == Path::new(path))
        {
            problems.push(format!(
                "{path}: allowed to break \"{rule}\" but no longer does: drop it from ALLOWED"
            ));
        }
    }
    problems
}

fn assert_kept(rule: Rule) {
    let problems = unallowed(rule);
    assert!(
        problems.is_empty(),
        "{} broken:\n{}",
        rule,
        problems.join("\n")
    );
}

#[test]
fn the_workspace_is_found() {
    let crates = crates(workspace_root());
    let files: usize = crates.iter().map(|c| c.files.len()).sum();
    assert!(
        files > 300,
        "only {files} source files found under {}",
        workspace_root().display()
    );
    for package in [
        "agentos-kernel/lib",
        "agentos-cli/bin main",
        "agentos-proto/lib",
    ] {
        assert!(
            crates.iter().any(|c| c.name == package),
            "{package} not found"
        );
    }
}

#[test]
fn the_allow_list_is_short_and_never_for_size_or_untyped_errors() {
    assert!(
        ALLOWED.len() <= 5,
        "{} entries allowed; at most five",
        ALLOWED.len()
    );
    for (rule, path, reason) in ALLOWED {
        assert!(
            !matches!(rule, Rule::FileSize | Rule::StringError),
            "{path} may not be allowed {rule}"
        );
        assert!(reason.len() > 20, "{path} needs its reason");
    }
}

#[test]
fn no_file_is_over_700_lines() {
    assert_kept(Rule::FileSize);
}

#[test]
fn errors_are_typed() {
    assert_kept(Rule::StringError);
}

#[test]
fn anyhow_stays_in_binaries_main_files() {
    assert_kept(Rule::Anyhow);
}

#[test]
fn json_is_built_and_read_through_types() {
    assert_kept(Rule::UntypedJson);
}

#[test]
fn threads_are_spawned_in_one_place() {
    assert_kept(Rule::ThreadBuilder);
}

#[test]
fn a_types_inherent_impl_is_in_one_file() {
    assert_kept(Rule::ImplSpread);
}

#[test]
fn no_import_cycles_in_any_crate() {
    for krate in crates(workspace_root()) {
        let files = file_graph(&krate.files);
        println!(
            "\n{}, module by module (each stands for every file under it):",
            krate.name
        );
        let parents: BTreeSet<&str> = files
            .graph
            .keys()
            .filter_map(|m| m.rsplit_once("::").map(|p| p.0))
            .collect();
        for parent in parents {
            for (node, edges) in level_graph(&files.graph, parent) {
                let edges: Vec<&str> = edges.iter().map(String::as_str).collect();
                println!("  {node} -> {}", edges.join(", "));
            }
        }
    }
    assert_kept(Rule::Cycle);
}

/// A workspace in a temporary directory, made of `files` (path, text).
fn planted(files: &[(&str, &str)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let mut all = vec![
        (
            "Cargo.toml",
            "[workspace]\nmembers = [\"kernel\", \"kernel/primitives\"]\n",
        ),
        ("kernel/Cargo.toml", "[package]\nname = \"k\"\n"),
        ("kernel/primitives/Cargo.toml", "[package]\nname = \"p\"\n"),
        ("kernel/primitives/src/lib.rs", "pub mod threads;\n"),
        (
            "kernel/primitives/src/threads.rs",
            "fn f() { std::thread::Builder::new(); }\n",
        ),
    ];
    all.extend_from_slice(files);
    for (path, text) in all {
        let path = dir.path().join(path);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, text).unwrap();
    }
    dir
}

/// What the rules find in a planted workspace, as `file:line: rule`.
fn found_in(files: &[(&str, &str)]) -> Vec<String> {
    let dir = planted(files);
    violations(dir.path())
        .into_iter()
        .map(|v| format!("{}:{}: {}", v.path.display(), v.line, v.rule))
        .collect()
}

#[test]
fn each_rule_finds_its_planted_violation() {
    let long = "fn f() {}\n".repeat(701);
    let tests_after = format!(
        "{}#[cfg(test)]\nmod tests {{\n{}}}\n",
        "fn f() {}\n".repeat(690),
        "fn g() {}\n".repeat(50)
    );
    let found = found_in(&[
        ("kernel/src/lib.rs", "mod long;\nmod short;\nmod errors;\nmod json;\nmod threads;\nmod a;\nmod b;\nmod tests_only;\n"),
        ("kernel/src/long.rs", &long),
        ("kernel/src/short.rs", &tests_after),
        (
            "kernel/src/errors.rs",
            "fn f() -> Result<(), String> { Ok(()) }\n\
             fn g() -> Result<(), Box<dyn std::error::Error>> { Ok(()) }\n\
             use anyhow::Context;\n\
             fn h() -> Result<u8, &'static str> { Ok(1) }\n\
             fn i() -> Result<u8, std::borrow::Cow<'static, str>> { Ok(1) }\n\
             fn j() -> Result<String, std::io::Error> { Ok(String::new()) }\n",
        ),
        (
            "kernel/src/json.rs",
            "fn f(v: serde_json::Value) -> bool {\n    let _ = serde_json::json!({});\n    println!(\"{}\", v[\"inside\"]);\n    v[\"ok\"] == true\n}\n",
        ),
        ("kernel/src/threads.rs", "fn f() {\n    let _ = std::thread::Builder::new();\n}\n"),
        ("kernel/src/a.rs", "pub struct Thing;\nimpl Thing {}\nfn f() { crate::b::g(); }\n"),
        ("kernel/src/b.rs", "use crate::a::Thing;\nimpl Thing {}\npub fn g() {}\nfn h() { super::a::f(); }\n"),
        (
            "kernel/src/tests_only.rs",
            "#[cfg(test)]\nmod tests {\n    fn f() -> Result<(), String> { let _ = serde_json::json!(1); Ok(()) }\n}\n",
        ),
        ("kernel/src/main.rs", "use anyhow::Result;\nfn main() {}\n"),
        ("kernel/tests/t.rs", "fn f() -> Result<(), String> { Ok(()) }\n"),
    ]);
    let expected = [
        "kernel/src/a.rs:3: import cycle",
        "kernel/src/b.rs:2: inherent impl spread over files",
        "kernel/src/errors.rs:1: untyped error",
        "kernel/src/errors.rs:2: untyped error",
        "kernel/src/errors.rs:3: anyhow outside a binary's main file",
        "kernel/src/errors.rs:4: untyped error",
        "kernel/src/errors.rs:5: untyped error",
        "kernel/src/json.rs:2: JSON built or read untyped",
        "kernel/src/json.rs:3: JSON built or read untyped",
        "kernel/src/json.rs:4: JSON built or read untyped",
        "kernel/src/long.rs:701: file over 700 lines",
        "kernel/src/threads.rs:2: thread spawned outside the threads module",
    ];
    assert_eq!(found, expected);
}

#[test]
fn a_cycle_through_a_child_module_or_a_macro_is_found_and_a_tree_is_not() {
    let found = found_in(&[
        ("kernel/src/lib.rs", "pub mod top;\n"),
        (
            "kernel/src/top/mod.rs",
            "mod child;\nfn f() { child::g(); }\n",
        ),
        (
            "kernel/src/top/child.rs",
            "pub fn g() {}\nfn h() { println!(\"{}\", super::f()); }\n",
        ),
    ]);
    assert_eq!(found, ["kernel/src/top/mod.rs:2: import cycle"]);
    let found = found_in(&[
        ("kernel/src/lib.rs", "pub mod top;\n"),
        (
            "kernel/src/top/mod.rs",
            "mod child;\nfn f() { child::g(); }\n",
        ),
        (
            "kernel/src/top/child.rs",
            "pub fn g() { let _ = \"super::f\"; } // super::f\n",
        ),
    ]);
    assert!(found.is_empty(), "{found:?}");
}

#[test]
fn an_impl_is_placed_by_the_type_it_names_not_by_its_name() {
    // Two types called `Record` in two modules: each in one file.
    let found = found_in(&[
        ("kernel/src/lib.rs", "mod a;\nmod b;\n"),
        ("kernel/src/a.rs", "pub struct Record;\nimpl Record {}\n"),
        ("kernel/src/b.rs", "pub struct Record;\nimpl Record {}\n"),
    ]);
    assert!(found.is_empty(), "{found:?}");
}
