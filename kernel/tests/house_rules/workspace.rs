//! The workspace's crates and their source files, found the way the
//! compiler finds them: from each target's root file, through its `mod`
//! declarations.

use std::fs;
use std::path::{Path, PathBuf};

use syn::{Attribute, Item, ItemMod, Meta};

/// One crate: a library, a binary, or a test, bench or example target.
pub struct Crate {
    /// `package/target`, e.g. `agentos-kernel/lib`.
    pub name: String,
    pub files: Vec<SourceFile>,
}

/// One source file of a crate.
pub struct SourceFile {
    /// Relative to the workspace's root.
    pub path: PathBuf,
    /// Its module path (`crate::exec::queues`).
    pub module: String,
    pub syntax: syn::File,
    pub lines: usize,
    /// A test file: a test target's, or reached through `#[cfg(test)]`.
    pub is_test: bool,
    /// The root file of a binary, the one place `anyhow` may appear.
    pub is_binary_root: bool,
}

/// What kind of target a root file starts.
#[derive(Clone, Copy, PartialEq)]
pub enum Target {
    Library,
    Binary,
    Test,
}

/// Every crate of the workspace rooted at `root` (the members its
/// `Cargo.toml` lists; excluded directories are not members).
pub fn crates(root: &Path) -> Vec<Crate> {
    let manifest: toml::Table = read(&root.join("Cargo.toml")).parse().unwrap();
    let members: Vec<PathBuf> = manifest["workspace"]["members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| root.join(m.as_str().unwrap()))
        .collect();
    let mut out = Vec::new();
    for dir in &members {
        let manifest: toml::Table = read(&dir.join("Cargo.toml")).parse().unwrap();
        let test_only = is_test_support(&manifest);
        for (name, file, target) in targets(dir) {
            let mut files = Vec::new();
            let at = Walk {
                root,
                module: "crate".to_owned(),
                is_test: test_only || target == Target::Test,
            };
            walk(&at, &file, true, target == Target::Binary, &mut files);
            out.push(Crate { name, files });
        }
    }
    out
}

/// Whether a package is test code: one that says so in its manifest
/// (`[package.metadata.agentos] test-support = true`), a library of
/// helpers the tests (and the benchmarks' stubs) share.
fn is_test_support(manifest: &toml::Table) -> bool {
    manifest["package"]
        .get("metadata")
        .and_then(|m| m.get("agentos"))
        .and_then(|m| m.get("test-support"))
        .and_then(|flag| flag.as_bool())
        .unwrap_or(false)
}

/// A package's targets: `(package/target, root file, kind)`.
fn targets(dir: &Path) -> Vec<(String, PathBuf, Target)> {
    let manifest: toml::Table = read(&dir.join("Cargo.toml")).parse().unwrap();
    let package = manifest["package"]["name"].as_str().unwrap().to_owned();
    let path_of = |table: &toml::Value| {
        table
            .get("path")
            .and_then(|p| p.as_str())
            .map(|p| dir.join(p))
    };
    let mut out = Vec::new();
    let lib = manifest
        .get("lib")
        .and_then(&path_of)
        .unwrap_or(dir.join("src/lib.rs"));
    if lib.exists() {
        out.push((format!("{package}/lib"), lib, Target::Library));
    }
    let mut binaries: Vec<PathBuf> = manifest
        .get("bin")
        .and_then(|b| b.as_array())
        .into_iter()
        .flatten()
        .filter_map(&path_of)
        .collect();
    binaries.push(dir.join("src/main.rs"));
    binaries.extend(rust_files(&dir.join("src/bin")));
    binaries.sort();
    binaries.dedup();
    for file in binaries.into_iter().filter(|f| f.exists()) {
        let stem = file.file_stem().unwrap().to_string_lossy().into_owned();
        out.push((format!("{package}/bin {stem}"), file, Target::Binary));
    }
    for kind in ["tests", "benches", "examples"] {
        let tests = dir.join(kind);
        let mut roots = rust_files(&tests);
        if let Ok(entries) = fs::read_dir(&tests) {
            roots.extend(
                entries
                    .map(|e| e.unwrap().path().join("main.rs"))
                    .filter(|main| main.exists()),
            );
        }
        roots.sort();
        for file in roots {
            let name = file.strip_prefix(dir).unwrap().display().to_string();
            out.push((format!("{package}/{name}"), file, Target::Test));
        }
    }
    out
}

/// The `.rs` files directly in `dir`.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_file() && p.extension().is_some_and(|e| e == "rs"))
        .collect()
}

fn read(path: &Path) -> String {
    fs::read_to_string(path).unwrap_or_else(|err| panic!("{}: {err}", path.display()))
}

/// Where a walk through the module tree stands.
struct Walk<'a> {
    root: &'a Path,
    module: String,
    is_test: bool,
}

/// Reads `file` as the module `at.module`, then the files of the modules it
/// declares.
fn walk(
    at: &Walk<'_>,
    file: &Path,
    owns_directory: bool,
    is_binary_root: bool,
    out: &mut Vec<SourceFile>,
) {
    let text = read(file);
    let syntax = syn::parse_file(&text).unwrap_or_else(|err| {
        let start = err.span().start();
        panic!("{}:{}: {err}", file.display(), start.line)
    });
    // `a.rs`'s children live in `a/`; `mod.rs`'s, `lib.rs`'s and
    // `main.rs`'s beside it.
    let children = if owns_directory {
        file.parent().unwrap().to_path_buf()
    } else {
        file.with_extension("")
    };
    declared(at, &syntax.items, &children, out);
    out.push(SourceFile {
        path: file.strip_prefix(at.root).unwrap_or(file).to_path_buf(),
        module: at.module.clone(),
        syntax,
        lines: text.lines().count(),
        is_test: at.is_test,
        is_binary_root,
    });
}

/// Walks the modules `items` declare, inline ones included.
fn declared(at: &Walk<'_>, items: &[Item], children: &Path, out: &mut Vec<SourceFile>) {
    for item in items {
        let Item::Mod(module) = item else { continue };
        let inner = Walk {
            root: at.root,
            module: format!("{}::{}", at.module, module.ident),
            is_test: at.is_test || is_test_only(&module.attrs),
        };
        let directory = children.join(module.ident.to_string());
        match &module.content {
            Some((_, items)) => declared(&inner, items, &directory, out),
            None => {
                let (file, owns_directory) = module_file(module, children);
                walk(&inner, &file, owns_directory, false, out);
            }
        }
    }
}

/// The file a `mod name;` declaration reads, and whether it is a `mod.rs`.
fn module_file(module: &ItemMod, children: &Path) -> (PathBuf, bool) {
    assert!(
        !module.attrs.iter().any(|attr| attr.path().is_ident("path")),
        "`#[path]` on `mod {}` in {}: the house rules find files by their module's name",
        module.ident,
        children.display()
    );
    let name = module.ident.to_string();
    let flat = children.join(format!("{name}.rs"));
    if flat.exists() {
        (flat, false)
    } else {
        (children.join(name).join("mod.rs"), true)
    }
}

/// `#[cfg(test)]`, or a `cfg(all(test, …))`: code that only tests build.
pub fn is_test_only(attrs: &[Attribute]) -> bool {
    attrs.iter().any(|attr| {
        let Meta::List(list) = &attr.meta else {
            return false;
        };
        if !list.path.is_ident("cfg") {
            return false;
        }
        let tokens = list.tokens.to_string().replace(' ', "");
        tokens == "test" || tokens.starts_with("all(test,")
    })
}
