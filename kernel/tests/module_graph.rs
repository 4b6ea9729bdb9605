//! The kernel's modules depend on each other without cycles: the reactor
//! on the syscalls, the syscalls on the subsystems, the subsystems on the
//! sandbox layer and the leaves (`address`, `identity`, `config`, …) —
//! never back up. Checked from the source: every `crate::<module>` path a
//! module names (outside comments) is an edge of the graph of top-level
//! modules, and `super::<sibling>` / `crate::<module>::<sibling>` paths
//! are edges between the submodules of one module.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

type Graph = BTreeMap<String, BTreeSet<String>>;

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

/// The code of a file without its comments (doc links are not imports).
fn code_of(path: &Path) -> String {
    fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|line| line.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Identifiers following each occurrence of `prefix` in `code`.
fn names_after<'a>(code: &'a str, prefix: &'a str) -> impl Iterator<Item = &'a str> + 'a {
    code.match_indices(prefix).filter_map(move |(at, _)| {
        let rest = &code[at + prefix.len()..];
        let end = rest
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(rest.len());
        (end > 0).then(|| &rest[..end])
    })
}

/// The first cycle in `graph`, if there is one.
fn cycle(graph: &Graph) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &Graph,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|n| n == node) {
            let mut found = path[at..].to_vec();
            found.push(node.to_owned());
            return Some(found);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_owned());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(found) = visit(next, graph, path, done) {
                return Some(found);
            }
        }
        path.pop();
        done.insert(node.to_owned());
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|node| visit(node, graph, &mut Vec::new(), &mut done))
}

#[test]
fn kernel_modules_have_no_import_cycles() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    source_files(&src, &mut files);
    let mut top = Graph::new();
    let mut inner: BTreeMap<String, Graph> = BTreeMap::new();
    for file in &files {
        let relative = file.strip_prefix(&src).unwrap();
        let parts: Vec<String> = relative
            .with_extension("")
            .iter()
            .map(|p| p.to_string_lossy().into_owned())
            .collect();
        if parts[0] == "lib" || parts[0] == "bin" {
            continue;
        }
        let module = parts[0].clone();
        let code = code_of(file);
        let edges = top.entry(module.clone()).or_default();
        for name in names_after(&code, "crate::") {
            if name != module {
                edges.insert(name.to_owned());
            }
        }
        // A submodule's edges to its siblings (its own directory's files).
        if parts.len() >= 2 && parts[1] != "mod" {
            let child = parts[1].clone();
            let siblings = inner.entry(module.clone()).or_default();
            let edges = siblings.entry(child.clone()).or_default();
            let within = format!("crate::{module}::");
            let nested = parts.len() > 2 && parts[2] != "mod";
            let names: Vec<&str> = names_after(&code, &within)
                .chain(if nested {
                    Vec::new()
                } else {
                    names_after(&code, "super::").collect()
                })
                .collect();
            for name in names {
                if name != child {
                    edges.insert(name.to_owned());
                }
            }
        }
    }
    assert!(
        top.len() > 5,
        "the source tree was not found under {}",
        src.display()
    );
    if let Some(found) = cycle(&top) {
        panic!(
            "import cycle between kernel modules: {}\nthe graph: {top:#?}",
            found.join(" -> ")
        );
    }
    for (module, graph) in &inner {
        // Only edges between real siblings count (not items of mod.rs).
        let children: BTreeSet<String> = graph.keys().cloned().collect();
        let graph: Graph = graph
            .iter()
            .map(|(child, edges)| {
                let edges = edges.intersection(&children).cloned().collect();
                (child.clone(), edges)
            })
            .collect();
        if let Some(found) = cycle(&graph) {
            panic!(
                "import cycle inside {module}: {}\nits graph: {graph:#?}",
                found.join(" -> ")
            );
        }
    }
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
