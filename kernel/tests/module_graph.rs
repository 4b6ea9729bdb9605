//! The kernel's files and modules depend on each other without cycles: the
//! reactor on the syscalls, the syscalls on the kernel's wiring, the wiring
//! on the subsystems, the subsystems on the sandbox layer and the leaves —
//! never back up, and inside a module, never from a file back to one that
//! uses it.
//!
//! Checked from the source. Every path a file names outside comments and
//! strings — in `use` declarations (grouped `{…}` ones and re-exports
//! included) and in code (`crate::…`, `super::…`, `self::…`, or a child
//! module by its name) — is an edge from that file to the file of the
//! module it names. Cycles are looked for between files, and between the
//! modules at each level of the tree (a module standing for every file
//! under it).
//!
//! `cargo test -p agentos-kernel --test module_graph -- --nocapture`
//! prints the graph of modules, level by level.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fs;
use std::path::{Path, PathBuf};

/// Nodes and their edges, by module path (`crate::exec::queues`).
type Graph = BTreeMap<String, BTreeSet<String>>;

/// One source file of the kernel's library, as a module.
struct SourceFile {
    /// Its module path.
    module: String,
    /// Its code, without comments or the contents of literals.
    code: String,
}

fn source_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            source_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The module path of a file under `src` (`exec/mod.rs` is `crate::exec`).
fn module_of(relative: &Path) -> String {
    let mut parts = vec!["crate".to_owned()];
    for part in relative.with_extension("").iter() {
        let part = part.to_string_lossy();
        if part != "mod" && part != "lib" {
            parts.push(part.into_owned());
        }
    }
    parts.join("::")
}

/// `text` with comments removed and string and character literals emptied,
/// so that only code is left to read paths from.
fn strip(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut depth = 0;
            while i < chars.len() {
                if chars[i] == '/' && chars.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if chars[i] == '*' && chars.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
            out.push(' ');
        } else if c == 'r' && (next == Some('"') || next == Some('#')) && !is_ident(prev(&chars, i))
        {
            // A raw string: r"…", r#"…"#.
            let mut j = i + 1;
            let mut hashes = 0;
            while chars.get(j) == Some(&'#') {
                hashes += 1;
                j += 1;
            }
            if chars.get(j) != Some(&'"') {
                out.push(c);
                i += 1;
                continue;
            }
            j += 1;
            loop {
                if j >= chars.len() {
                    break;
                }
                if chars[j] == '"' && (0..hashes).all(|k| chars.get(j + 1 + k) == Some(&'#')) {
                    j += 1 + hashes;
                    break;
                }
                j += 1;
            }
            out.push_str("\"\"");
            i = j;
        } else if c == '"' {
            i += 1;
            while i < chars.len() && chars[i] != '"' {
                if chars[i] == '\\' {
                    i += 1;
                }
                i += 1;
            }
            i += 1;
            out.push_str("\"\"");
        } else if c == '\'' {
            // A character literal ('x', '\n', '\u{1F}'), or a lifetime.
            if next == Some('\\') {
                let mut j = i + 2;
                while j < chars.len() && chars[j] != '\'' {
                    j += 1;
                }
                i = j + 1;
                out.push_str("' '");
            } else if chars.get(i + 2) == Some(&'\'') {
                i += 3;
                out.push_str("' '");
            } else {
                out.push(c);
                i += 1;
            }
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

fn prev(chars: &[char], i: usize) -> char {
    if i == 0 {
        ' '
    } else {
        chars[i - 1]
    }
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// The code as tokens: identifiers, `::`, and single punctuation.
fn tokens(code: &str) -> Vec<String> {
    let chars: Vec<char> = code.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c.is_whitespace() {
            i += 1;
        } else if is_ident(c) {
            let start = i;
            while i < chars.len() && is_ident(chars[i]) {
                i += 1;
            }
            out.push(chars[start..i].iter().collect());
        } else if c == ':' && chars.get(i + 1) == Some(&':') {
            out.push("::".to_owned());
            i += 2;
        } else {
            out.push(c.to_string());
            i += 1;
        }
    }
    out
}

/// The paths a `use` tree names, its groups expanded: `a::{b, c::{d, self}}`
/// is `a::b`, `a::c::d` and `a::c`.
fn use_paths(tree: &[String]) -> Vec<Vec<String>> {
    fn expand(tree: &[String], prefix: &[String], out: &mut Vec<Vec<String>>) {
        let mut path = prefix.to_vec();
        let mut i = 0;
        while i < tree.len() {
            match tree[i].as_str() {
                "::" => i += 1,
                "{" => {
                    // Each comma-separated branch at this depth.
                    let mut depth = 0;
                    let mut start = i + 1;
                    for j in i..tree.len() {
                        match tree[j].as_str() {
                            "{" => depth += 1,
                            "}" => {
                                depth -= 1;
                                if depth == 0 {
                                    expand(&tree[start..j], &path, out);
                                    return;
                                }
                            }
                            "," if depth == 1 => {
                                expand(&tree[start..j], &path, out);
                                start = j + 1;
                            }
                            _ => {}
                        }
                    }
                    return;
                }
                "as" | "*" => break,
                "self" if !path.is_empty() => i += 1,
                name => {
                    path.push(name.to_owned());
                    i += 1;
                }
            }
        }
        if !path.is_empty() {
            out.push(path);
        }
    }
    let mut out = Vec::new();
    expand(tree, &[], &mut out);
    out
}

/// The module a path starting at `module` reaches: `crate`, `super` and
/// `self` resolved, then the longest prefix that is a module of the crate.
fn resolve(module: &str, path: &[String], modules: &BTreeSet<String>) -> Option<String> {
    let mut at: Vec<String> = module.split("::").map(str::to_owned).collect();
    let mut rest = path;
    match rest.first().map(String::as_str) {
        Some("crate") => {
            at = vec!["crate".to_owned()];
            rest = &rest[1..];
        }
        Some("super") | Some("self") => {
            while let Some(step) = rest.first() {
                match step.as_str() {
                    "super" => {
                        at.pop();
                    }
                    "self" => {}
                    _ => break,
                }
                rest = &rest[1..];
            }
        }
        _ => return None,
    }
    let mut found = None;
    let mut candidate = at.join("::");
    if modules.contains(&candidate) {
        found = Some(candidate.clone());
    }
    for part in rest {
        candidate = format!("{candidate}::{part}");
        if modules.contains(&candidate) {
            found = Some(candidate.clone());
        }
    }
    found
}

/// Paths that start where a path may start in `tokens`: `crate::`,
/// `super::`, `self::`, or a name followed by `::` that is not itself
/// after a `::`. Those inside `use` declarations come expanded.
fn paths(tokens: &[String]) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < tokens.len() {
        if tokens[i] == "use" {
            let end = tokens[i..]
                .iter()
                .position(|t| t == ";")
                .map_or(tokens.len(), |at| i + at);
            out.extend(use_paths(&tokens[i + 1..end]));
            i = end + 1;
            continue;
        }
        let starts = is_ident(tokens[i].chars().next().unwrap_or(' '))
            && tokens.get(i + 1).is_some_and(|t| t == "::")
            && (i == 0 || tokens[i - 1] != "::");
        if starts {
            let mut path = vec![tokens[i].clone()];
            let mut j = i + 1;
            while tokens.get(j).is_some_and(|t| t == "::")
                && tokens
                    .get(j + 1)
                    .is_some_and(|t| is_ident(t.chars().next().unwrap_or(' ')))
            {
                path.push(tokens[j + 1].clone());
                j += 2;
            }
            out.push(path);
            i = j;
            continue;
        }
        i += 1;
    }
    out
}

/// The inline modules (`mod name { … }`) of a file's tokens, as the token
/// ranges they span; a path inside one starts from it.
fn inline_modules(tokens: &[String]) -> Vec<(String, usize, usize)> {
    let mut out = Vec::new();
    for i in 0..tokens.len() {
        if tokens[i] == "mod" && tokens.get(i + 2).is_some_and(|t| t == "{") {
            let mut depth = 0;
            for j in i + 2..tokens.len() {
                match tokens[j].as_str() {
                    "{" => depth += 1,
                    "}" => {
                        depth -= 1;
                        if depth == 0 {
                            out.push((tokens[i + 1].clone(), i + 3, j));
                            break;
                        }
                    }
                    _ => {}
                }
            }
        }
    }
    out
}

/// The files each file names.
fn file_graph(files: &[SourceFile]) -> Graph {
    let modules: BTreeSet<String> = files.iter().map(|f| f.module.clone()).collect();
    let mut graph = Graph::new();
    for file in files {
        let tokens = tokens(&file.code);
        let inline = inline_modules(&tokens);
        let edges = graph.entry(file.module.clone()).or_default();
        let mut add = |from: &str, found: Vec<Vec<String>>| {
            for path in found {
                // A bare name is a path from this module when it is one of
                // its child modules (`queues::Queues` in `exec/mod.rs`).
                let relative = match path[0].as_str() {
                    "crate" | "super" | "self" => path,
                    _ => std::iter::once("self".to_owned()).chain(path).collect(),
                };
                if let Some(to) = resolve(from, &relative, &modules) {
                    if to != file.module {
                        edges.insert(to);
                    }
                }
            }
        };
        // Paths inside inline modules start from them; the rest from the
        // file's own module.
        let mut covered = vec![false; tokens.len()];
        for (name, start, end) in &inline {
            let from = format!("{}::{name}", file.module);
            add(&from, paths(&tokens[*start..*end]));
            covered[*start..*end].iter_mut().for_each(|c| *c = true);
        }
        let outside: Vec<String> = tokens
            .iter()
            .zip(&covered)
            .map(|(t, inside)| if *inside { ";".to_owned() } else { t.clone() })
            .collect();
        add(&file.module, paths(&outside));
    }
    graph
}

/// The graph among the children of `parent` (each standing for every file
/// under it) and `parent`'s own file.
fn level_graph(files: &Graph, parent: &str) -> Graph {
    let prefix = format!("{parent}::");
    let member = |module: &str| -> Option<String> {
        if module == parent {
            return Some(parent.to_owned());
        }
        let rest = module.strip_prefix(&prefix)?;
        let child = rest.split("::").next()?;
        Some(format!("{prefix}{child}"))
    };
    let mut graph = Graph::new();
    for (from, edges) in files {
        let Some(from) = member(from) else { continue };
        let node = graph.entry(from.clone()).or_default();
        for to in edges {
            if let Some(to) = member(to) {
                if to != from {
                    node.insert(to);
                }
            }
        }
    }
    graph
}

/// The first cycle in `graph`, if there is one.
fn cycle(graph: &Graph) -> Option<Vec<String>> {
    cycles(graph).into_iter().next().map(|(path, _)| path)
}

/// Each group of nodes that reach each other (each strongly connected
/// component of more than one node), with one cycle through it.
fn cycles(graph: &Graph) -> Vec<(Vec<String>, BTreeSet<String>)> {
    let mut found = Vec::new();
    let mut grouped = BTreeSet::new();
    for start in graph.keys() {
        if grouped.contains(start) {
            continue;
        }
        let reach_from = reachable(graph, start);
        let group: BTreeSet<String> = reach_from
            .iter()
            .filter(|node| *node != start && reachable(graph, node).contains(start))
            .cloned()
            .collect();
        if group.is_empty() {
            continue;
        }
        grouped.insert(start.clone());
        grouped.extend(group.iter().cloned());
        let path = path_back(graph, start, &group);
        let mut members = group;
        members.insert(start.clone());
        found.push((path, members));
    }
    found
}

/// Every node reachable from `start` (itself only through a cycle).
fn reachable(graph: &Graph, start: &str) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    let mut stack: Vec<&str> = graph
        .get(start)
        .into_iter()
        .flatten()
        .map(String::as_str)
        .collect();
    while let Some(node) = stack.pop() {
        if seen.insert(node.to_owned()) {
            stack.extend(graph.get(node).into_iter().flatten().map(String::as_str));
        }
    }
    seen
}

/// A shortest path from `start` back to itself through `group`.
fn path_back(graph: &Graph, start: &str, group: &BTreeSet<String>) -> Vec<String> {
    let mut came_from: BTreeMap<String, String> = BTreeMap::new();
    let mut queue = VecDeque::from([start.to_owned()]);
    while let Some(node) = queue.pop_front() {
        for to in graph.get(&node).into_iter().flatten() {
            if to == start {
                let mut path = vec![node.clone()];
                while let Some(before) = came_from.get(path.last().unwrap()) {
                    path.push(before.clone());
                }
                path.reverse();
                path.push(start.to_owned());
                return path;
            }
            if group.contains(to) && !came_from.contains_key(to) {
                came_from.insert(to.clone(), node.clone());
                queue.push_back(to.clone());
            }
        }
    }
    vec![start.to_owned()]
}

fn kernel_files() -> Vec<SourceFile> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut paths = Vec::new();
    source_files(&src, &mut paths);
    paths
        .into_iter()
        .filter_map(|path| {
            let relative = path.strip_prefix(&src).unwrap().to_path_buf();
            // The binaries are crates of their own.
            if relative.starts_with("bin") {
                return None;
            }
            Some(SourceFile {
                module: module_of(&relative),
                code: strip(&fs::read_to_string(&path).unwrap()),
            })
        })
        .collect()
}

/// Short names for printing: `crate::exec::queues` is `exec::queues`.
fn short(module: &str) -> &str {
    module.strip_prefix("crate::").unwrap_or("(lib)")
}

/// A cycle, and every node caught in cycles with it.
fn describe(path: &[String], members: &BTreeSet<String>) -> String {
    let path: Vec<&str> = path.iter().map(|m| short(m)).collect();
    let members: Vec<&str> = members.iter().map(|m| short(m)).collect();
    format!(
        "{} (all of {} reach each other)",
        path.join(" -> "),
        members.join(", ")
    )
}

#[test]
fn kernel_files_and_modules_have_no_import_cycles() {
    let files = kernel_files();
    assert!(
        files.len() > 20,
        "the kernel's sources were not found under {}",
        env!("CARGO_MANIFEST_DIR")
    );
    let graph = file_graph(&files);
    let mut problems = Vec::new();
    let mut reported = Vec::new();
    for (path, members) in cycles(&graph) {
        problems.push(format!("between files: {}", describe(&path, &members)));
        reported.push(members);
    }
    // Every module with children is a level of its own.
    let parents: BTreeSet<String> = graph
        .keys()
        .filter_map(|m| m.rsplit_once("::").map(|(parent, _)| parent.to_owned()))
        .collect();
    println!("The kernel's modules, level by level (each stands for every file under it):");
    for parent in &parents {
        let level = level_graph(&graph, parent);
        println!(
            "\n{}:",
            if parent == "crate" {
                "crate"
            } else {
                short(parent)
            }
        );
        for (node, edges) in &level {
            let edges: Vec<&str> = edges.iter().map(|m| short(m)).collect();
            println!("  {} -> {}", short(node), edges.join(", "));
        }
        for (path, members) in cycles(&level) {
            // A cycle of files is one of their modules too: said once.
            if !reported.contains(&members) {
                problems.push(format!("between modules: {}", describe(&path, &members)));
                reported.push(members);
            }
        }
    }
    assert!(
        problems.is_empty(),
        "import cycles:\n{}",
        problems.join("\n")
    );
}

#[test]
fn the_cycle_finder_finds_cycles() {
    let graph: Graph = [("a", "b"), ("b", "c"), ("c", "a"), ("d", "a")]
        .into_iter()
        .fold(Graph::new(), |mut graph, (from, to)| {
            graph.entry(from.into()).or_default().insert(to.into());
            graph
        });
    assert_eq!(cycle(&graph).unwrap(), ["a", "b", "c", "a"]);
    let mut acyclic = graph.clone();
    acyclic.get_mut("c").unwrap().clear();
    assert_eq!(cycle(&acyclic), None);
}

#[test]
fn every_kind_of_path_is_an_edge() {
    let files: Vec<SourceFile> = [
        ("crate", "pub mod a; pub mod b; pub mod c; pub mod d;"),
        (
            "crate::a",
            "mod inner; use super::{b::{self, Thing as T}, c};\n\
             fn f() -> inner::X { inner::X }",
        ),
        ("crate::a::inner", "pub(crate) use crate::d::*;"),
        (
            "crate::b",
            "fn f() { let s = \"crate::c\"; crate::a::f(); }",
        ),
        (
            "crate::c",
            "// use crate::a;\n/* crate::b */ fn f(_: &'static str) {}",
        ),
        (
            "crate::d",
            "#[cfg(test)] mod tests { use super::super::c; }",
        ),
    ]
    .into_iter()
    .map(|(module, code)| SourceFile {
        module: module.to_owned(),
        code: strip(code),
    })
    .collect();
    let graph = file_graph(&files);
    let edges = |module: &str| -> Vec<&str> { graph[module].iter().map(String::as_str).collect() };
    assert_eq!(
        edges("crate::a"),
        ["crate::a::inner", "crate::b", "crate::c"]
    );
    assert_eq!(edges("crate::a::inner"), ["crate::d"]);
    // A string or a comment names nothing.
    assert_eq!(edges("crate::b"), ["crate::a"]);
    assert!(edges("crate::c").is_empty());
    // `super` inside an inline module starts from it.
    assert_eq!(edges("crate::d"), ["crate::c"]);
    assert_eq!(cycle(&graph).unwrap(), ["crate::a", "crate::b", "crate::a"]);
    // At the top level `a` stands for `a::inner` too.
    let top = level_graph(&graph, "crate");
    assert!(top["crate::a"].contains("crate::d"), "{top:?}");
}
