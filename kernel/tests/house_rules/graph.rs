//! Which files of a crate name which, and the cycles among them.
//!
//! Every path a file names — in `use` declarations (grouped and re-exported
//! ones included), in code, and in macros' tokens — that starts `crate::`,
//! `super::`, `self::` or with one of the module's children is an edge from
//! that file to the file of the module it reaches. Cycles are looked for
//! between files, and between the modules at each level of the tree (a
//! module standing for every file under it). Test code counts: a test that
//! reaches back up the tree ties the tree in a knot like any other code.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::PathBuf;

use syn::visit::{self, Visit};

use crate::rules::{token_paths, use_paths, Rule, Violation};
use crate::workspace::SourceFile;

/// Nodes and their edges, by module path (`crate::exec::queues`).
pub type Graph = BTreeMap<String, BTreeSet<String>>;

/// A crate's files as a graph, and where each file first names each other.
pub struct FileGraph {
    pub graph: Graph,
    /// The line of `from`'s file where it first names `to`, by `(from, to)`.
    pub lines: BTreeMap<(String, String), usize>,
    /// Each module's file.
    pub paths: BTreeMap<String, PathBuf>,
}

/// The files each file of one crate names.
pub fn file_graph(files: &[SourceFile]) -> FileGraph {
    let modules: BTreeSet<String> = files.iter().map(|f| f.module.clone()).collect();
    let mut graph = Graph::new();
    let mut lines = BTreeMap::new();
    for file in files {
        let mut reader = PathReader {
            scope: vec![file.module.clone()],
            found: Vec::new(),
        };
        reader.visit_file(&file.syntax);
        let edges = graph.entry(file.module.clone()).or_default();
        for (from, path, line) in reader.found {
            if let Some(to) = resolve(&from, &path, &modules) {
                if to != file.module {
                    lines
                        .entry((file.module.clone(), to.clone()))
                        .or_insert(line);
                    edges.insert(to);
                }
            }
        }
    }
    let paths = files
        .iter()
        .map(|f| (f.module.clone(), f.path.clone()))
        .collect();
    FileGraph {
        graph,
        lines,
        paths,
    }
}

/// The paths a file names, each with the module it is named from (an
/// inline module's paths start from it).
struct PathReader {
    scope: Vec<String>,
    found: Vec<(String, Vec<String>, usize)>,
}

impl PathReader {
    fn note(&mut self, path: Vec<String>, line: usize) {
        let from = self.scope.last().unwrap().clone();
        self.found.push((from, path, line));
    }
}

impl<'ast> Visit<'ast> for PathReader {
    fn visit_item_mod(&mut self, module: &'ast syn::ItemMod) {
        if module.content.is_some() {
            let inner = format!("{}::{}", self.scope.last().unwrap(), module.ident);
            self.scope.push(inner);
            visit::visit_item_mod(self, module);
            self.scope.pop();
        }
    }

    fn visit_item_use(&mut self, item: &'ast syn::ItemUse) {
        let line = item.use_token.span.start().line;
        for path in use_paths(&item.tree) {
            self.note(path, line);
        }
    }

    fn visit_path(&mut self, path: &'ast syn::Path) {
        if path.segments.len() > 1 {
            let line = path.segments[0].ident.span().start().line;
            self.note(
                path.segments.iter().map(|s| s.ident.to_string()).collect(),
                line,
            );
        }
        visit::visit_path(self, path);
    }

    fn visit_macro(&mut self, mac: &'ast syn::Macro) {
        // A `macro_rules!` body is code of whichever file expands it, and
        // `$crate::` paths in it must go through the crate's root.
        if mac.path.is_ident("macro_rules") {
            return;
        }
        self.visit_path(&mac.path);
        let mut paths = Vec::new();
        token_paths(&mac.tokens, &mut paths);
        for (path, line) in paths {
            self.note(path, line);
        }
    }
}

/// The file module a path named from `module` reaches: `crate`, `super`
/// and `self` resolved (a bare first name is a child of `module`), then the
/// longest prefix that is a file's module.
pub fn resolve(module: &str, path: &[String], modules: &BTreeSet<String>) -> Option<String> {
    let mut at: Vec<&str> = module.split("::").collect();
    let mut rest = path;
    match rest.first().map(String::as_str) {
        Some("crate") => {
            at.truncate(1);
            rest = &rest[1..];
        }
        Some("super" | "self") => {
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
        _ => {}
    }
    let mut candidate = at.join("::");
    let mut found = modules.contains(&candidate).then(|| candidate.clone());
    for part in rest {
        candidate = format!("{candidate}::{part}");
        if modules.contains(&candidate) {
            found = Some(candidate.clone());
        }
    }
    // A bare name that is no child names something outside the crate.
    if found.as_deref() == Some(module) && !matches!(path[0].as_str(), "crate" | "super" | "self") {
        return None;
    }
    found
}

/// The graph among the children of `parent` (each standing for every file
/// under it) and `parent`'s own file.
pub fn level_graph(files: &Graph, parent: &str) -> Graph {
    let prefix = format!("{parent}::");
    let member = |module: &str| -> Option<String> {
        if module == parent {
            return Some(parent.to_owned());
        }
        let child = module.strip_prefix(&prefix)?.split("::").next()?;
        Some(format!("{prefix}{child}"))
    };
    let mut graph = Graph::new();
    for (from, edges) in files {
        let Some(from) = member(from) else { continue };
        let node = graph.entry(from.clone()).or_default();
        node.extend(
            edges
                .iter()
                .filter_map(|to| member(to))
                .filter(|to| *to != from),
        );
    }
    graph
}

/// Each group of nodes that reach each other (each strongly connected
/// component of more than one node), with one cycle through it.
pub fn cycles(graph: &Graph) -> Vec<(Vec<String>, BTreeSet<String>)> {
    let mut found = Vec::new();
    let mut grouped = BTreeSet::new();
    for start in graph.keys() {
        if grouped.contains(start) {
            continue;
        }
        let group: BTreeSet<String> = reachable(graph, start)
            .into_iter()
            .filter(|node| node != start && reachable(graph, node).contains(start))
            .collect();
        if group.is_empty() {
            continue;
        }
        let path = path_back(graph, start, &group);
        let mut members = group;
        members.insert(start.clone());
        grouped.extend(members.iter().cloned());
        found.push((path, members));
    }
    found
}

/// Every node reachable from `start` (itself only through a cycle).
fn reachable(graph: &Graph, start: &str) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    let mut stack: Vec<&String> = graph.get(start).into_iter().flatten().collect();
    while let Some(node) = stack.pop() {
        if seen.insert(node.clone()) {
            stack.extend(graph.get(node).into_iter().flatten());
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

/// Every cycle in one crate, between files and then between the modules of
/// each level, each reported once, where its first file names the next.
pub fn crate_cycles(files: &FileGraph) -> Vec<Violation> {
    let mut found = Vec::new();
    let mut reported = Vec::new();
    let mut report = |kind: &str, path: Vec<String>, members: BTreeSet<String>| {
        if reported.contains(&members) {
            return;
        }
        let (file, line) = files.first_naming(&path[0], &path[1]);
        found.push(Violation {
            rule: Rule::Cycle,
            path: file,
            line,
            detail: format!("between {kind}: {}", describe(&path, &members)),
        });
        reported.push(members);
    };
    for (path, members) in cycles(&files.graph) {
        report("files", path, members);
    }
    let parents: BTreeSet<&str> = files
        .graph
        .keys()
        .filter_map(|m| m.rsplit_once("::").map(|(parent, _)| parent))
        .collect();
    for parent in parents {
        for (path, members) in cycles(&level_graph(&files.graph, parent)) {
            report("modules", path, members);
        }
    }
    found
}

impl FileGraph {
    /// The file under module `from` that first names a file under `to`, and
    /// the line where it does.
    fn first_naming(&self, from: &str, to: &str) -> (PathBuf, usize) {
        let under =
            |module: &str, top: &str| module == top || module.starts_with(&format!("{top}::"));
        self.lines
            .iter()
            .find(|((a, b), _)| under(a, from) && under(b, to))
            .map(|((a, _), line)| (self.paths[a].clone(), *line))
            .unwrap_or_else(|| (self.paths.get(from).cloned().unwrap_or_default(), 1))
    }
}

fn describe(path: &[String], members: &BTreeSet<String>) -> String {
    let members: Vec<&str> = members.iter().map(String::as_str).collect();
    format!(
        "{} (all of {} reach each other)",
        path.join(" -> "),
        members.join(", ")
    )
}
