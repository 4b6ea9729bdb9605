//! The rules read from one file at a time, and the places a type's
//! inherent `impl` blocks stand.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use proc_macro2::{Span, TokenStream, TokenTree};
use syn::punctuated::Punctuated;
use syn::spanned::Spanned;
use syn::visit::{self, Visit};
use syn::{Expr, GenericArgument, ImplItem, Item, PathArguments, Token, Type, UseTree};

use crate::workspace::{is_test_only, Crate, SourceFile};

/// The longest a source file may be.
pub const MAX_LINES: usize = 700;

/// The one file that may name `std::thread::Builder`.
pub const THREAD_HOME: &str = "kernel/primitives/src/threads.rs";

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Rule {
    FileSize,
    StringError,
    Anyhow,
    UntypedJson,
    ThreadBuilder,
    ImplSpread,
    Cycle,
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Rule::FileSize => "file over 700 lines",
            Rule::StringError => "untyped error",
            Rule::Anyhow => "anyhow outside a binary's main file",
            Rule::UntypedJson => "JSON built or read untyped",
            Rule::ThreadBuilder => "thread spawned outside the threads module",
            Rule::ImplSpread => "inherent impl spread over files",
            Rule::Cycle => "import cycle",
        })
    }
}

/// One broken rule, where it is broken.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Violation {
    pub path: PathBuf,
    pub line: usize,
    pub rule: Rule,
    pub detail: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}:{}: {}: {}",
            self.path.display(),
            self.line,
            self.rule,
            self.detail
        )
    }
}

/// Everything one file breaks of the rules read file by file. Test code
/// breaks none of them.
pub fn check_file(file: &SourceFile) -> Vec<Violation> {
    if file.is_test {
        return Vec::new();
    }
    let mut reader = Reader {
        file,
        test_lines: 0,
        found: Vec::new(),
    };
    reader.visit_file(&file.syntax);
    let lines = file.lines - reader.test_lines;
    if lines > MAX_LINES {
        reader.found.push(Violation {
            rule: Rule::FileSize,
            path: file.path.clone(),
            line: MAX_LINES + 1,
            detail: format!("{lines} lines of code besides tests; split it by concern"),
        });
    }
    reader.found
}

struct Reader<'a> {
    file: &'a SourceFile,
    /// Lines spent on `#[cfg(test)]` items, which do not count.
    test_lines: usize,
    found: Vec<Violation>,
}

impl Reader<'_> {
    fn report(&mut self, rule: Rule, span: Span, detail: impl Into<String>) {
        self.found.push(Violation {
            rule,
            path: self.file.path.clone(),
            line: span.start().line,
            detail: detail.into(),
        });
    }

    /// Counts a test-only item's lines, which are read by no rule here.
    fn skip_test_item(&mut self, span: Span) {
        self.test_lines += span.end().line + 1 - span.start().line;
    }

    fn check_path(&mut self, path: &syn::Path) {
        let names: Vec<String> = path.segments.iter().map(|s| s.ident.to_string()).collect();
        self.check_names(&names, path_span(path));
        let last = path.segments.last();
        if let Some(last) = last.filter(|s| s.ident == "Result") {
            if let PathArguments::AngleBracketed(args) = &last.arguments {
                let types: Vec<&Type> = args
                    .args
                    .iter()
                    .filter_map(|a| match a {
                        GenericArgument::Type(t) => Some(t),
                        _ => None,
                    })
                    .collect();
                if types.len() == 2 && is_string(types[1]) {
                    self.report(
                        Rule::StringError,
                        path_span(path),
                        "an error of text: give it a type that says what failed",
                    );
                }
            }
        }
        if let Some(last) = last.filter(|s| s.ident == "Box") {
            if let PathArguments::AngleBracketed(args) = &last.arguments {
                if args.args.iter().any(is_dyn_error) {
                    self.report(
                        Rule::StringError,
                        path_span(path),
                        "`Box<dyn Error>`: give the error a type callers can match on",
                    );
                }
            }
        }
    }

    /// The rules a path's names alone break, in code or in a `use`.
    fn check_names(&mut self, names: &[String], span: Span) {
        if names.first().is_some_and(|n| n == "anyhow") && !self.file.is_binary_root {
            self.report(
                Rule::Anyhow,
                span,
                "`anyhow` belongs in a binary's main file; return a typed error",
            );
        }
        let builder = names
            .windows(2)
            .any(|w| w[0] == "thread" && w[1] == "Builder");
        if builder && self.file.path != Path::new(THREAD_HOME) {
            self.report(
                Rule::ThreadBuilder,
                span,
                format!("spawn threads with {THREAD_HOME}, which names them and logs their panics"),
            );
        }
    }

    /// Reads a macro's arguments as expressions where they are some
    /// (`format!`, `assert_eq!`, …), so what they hold is read too.
    fn visit_macro_body(&mut self, tokens: &TokenStream) {
        let parser = Punctuated::<Expr, Token![,]>::parse_terminated;
        if let Ok(exprs) = syn::parse::Parser::parse2(parser, tokens.clone()) {
            for expr in &exprs {
                self.visit_expr(expr);
            }
        }
    }
}

impl<'ast> Visit<'ast> for Reader<'_> {
    fn visit_item(&mut self, item: &'ast Item) {
        if is_test_only(item_attrs(item)) {
            self.skip_test_item(item.span());
            return;
        }
        visit::visit_item(self, item);
    }

    fn visit_impl_item(&mut self, item: &'ast ImplItem) {
        let attrs = match item {
            ImplItem::Fn(f) => &f.attrs,
            ImplItem::Const(c) => &c.attrs,
            ImplItem::Type(t) => &t.attrs,
            _ => return visit::visit_impl_item(self, item),
        };
        if !is_test_only(attrs) {
            visit::visit_impl_item(self, item);
        }
    }

    fn visit_path(&mut self, path: &'ast syn::Path) {
        self.check_path(path);
        visit::visit_path(self, path);
    }

    fn visit_item_use(&mut self, item: &'ast syn::ItemUse) {
        for names in use_paths(&item.tree) {
            self.check_names(&names, item.use_token.span);
        }
    }

    fn visit_expr_index(&mut self, index: &'ast syn::ExprIndex) {
        if let Expr::Lit(syn::ExprLit {
            lit: syn::Lit::Str(key),
            ..
        }) = &*index.index
        {
            self.report(
                Rule::UntypedJson,
                key.span(),
                format!("[\"{}\"]: read it into a typed struct", key.value()),
            );
        }
        visit::visit_expr_index(self, index);
    }

    fn visit_macro(&mut self, mac: &'ast syn::Macro) {
        self.check_path(&mac.path);
        if mac.path.segments.last().is_some_and(|s| s.ident == "json") {
            self.report(
                Rule::UntypedJson,
                path_span(&mac.path),
                "`json!`: build it from a typed struct",
            );
            return;
        }
        self.visit_macro_body(&mac.tokens);
    }
}

/// Text standing for an error: `String`, `&str`, `Box<str>`, `Cow<str>`.
fn is_string(ty: &Type) -> bool {
    match ty {
        Type::Reference(reference) => is_str(&reference.elem),
        Type::Path(p) if p.qself.is_none() => p.path.segments.last().is_some_and(|last| {
            match (last.ident.to_string().as_str(), &last.arguments) {
                ("String", PathArguments::None) => true,
                ("Box" | "Cow" | "Rc" | "Arc", PathArguments::AngleBracketed(args)) => args
                    .args
                    .iter()
                    .any(|arg| matches!(arg, GenericArgument::Type(t) if is_str(t))),
                _ => false,
            }
        }),
        _ => false,
    }
}

fn is_str(ty: &Type) -> bool {
    matches!(ty, Type::Path(p) if p.path.is_ident("str"))
}

fn is_dyn_error(arg: &GenericArgument) -> bool {
    let GenericArgument::Type(Type::TraitObject(object)) = arg else {
        return false;
    };
    object.bounds.iter().any(|bound| {
        matches!(bound, syn::TypeParamBound::Trait(t)
            if t.path.segments.last().is_some_and(|s| s.ident == "Error"))
    })
}

fn path_span(path: &syn::Path) -> Span {
    path.segments
        .first()
        .map_or_else(Span::call_site, |s| s.ident.span())
}

pub fn item_attrs(item: &Item) -> &[syn::Attribute] {
    match item {
        Item::Const(i) => &i.attrs,
        Item::Enum(i) => &i.attrs,
        Item::ExternCrate(i) => &i.attrs,
        Item::Fn(i) => &i.attrs,
        Item::ForeignMod(i) => &i.attrs,
        Item::Impl(i) => &i.attrs,
        Item::Macro(i) => &i.attrs,
        Item::Mod(i) => &i.attrs,
        Item::Static(i) => &i.attrs,
        Item::Struct(i) => &i.attrs,
        Item::Trait(i) => &i.attrs,
        Item::TraitAlias(i) => &i.attrs,
        Item::Type(i) => &i.attrs,
        Item::Union(i) => &i.attrs,
        Item::Use(i) => &i.attrs,
        _ => &[],
    }
}

/// The paths a `use` tree names, each in full (`use a::{b, c::d}` names
/// `a::b` and `a::c::d`; a glob names its module).
pub fn use_paths(tree: &UseTree) -> Vec<Vec<String>> {
    fn expand(tree: &UseTree, prefix: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
        match tree {
            UseTree::Path(p) => {
                prefix.push(p.ident.to_string());
                expand(&p.tree, prefix, out);
                prefix.pop();
            }
            UseTree::Name(n) if n.ident == "self" => out.push(prefix.clone()),
            UseTree::Name(n) => out.push([prefix.clone(), vec![n.ident.to_string()]].concat()),
            UseTree::Rename(r) if r.ident == "self" => out.push(prefix.clone()),
            UseTree::Rename(r) => out.push([prefix.clone(), vec![r.ident.to_string()]].concat()),
            UseTree::Glob(_) => out.push(prefix.clone()),
            UseTree::Group(g) => g.items.iter().for_each(|t| expand(t, prefix, out)),
        }
    }
    let mut out = Vec::new();
    expand(tree, &mut Vec::new(), &mut out);
    out
}

/// The paths written in a macro's tokens (`a::b::c` sequences), for what
/// syntax cannot read there, with their lines.
pub fn token_paths(tokens: &TokenStream, out: &mut Vec<(Vec<String>, usize)>) {
    let trees: Vec<TokenTree> = tokens.clone().into_iter().collect();
    let mut i = 0;
    while i < trees.len() {
        match &trees[i] {
            TokenTree::Group(group) => token_paths(&group.stream(), out),
            TokenTree::Ident(ident) if !after_path_separator(&trees, i) => {
                let mut path = vec![ident.to_string()];
                let mut j = i + 1;
                while is_path_separator(&trees, j) {
                    let Some(TokenTree::Ident(next)) = trees.get(j + 2) else {
                        break;
                    };
                    path.push(next.to_string());
                    j += 3;
                }
                if path.len() > 1 {
                    out.push((path, ident.span().start().line));
                    i = j;
                    continue;
                }
            }
            _ => {}
        }
        i += 1;
    }
}

fn is_path_separator(trees: &[TokenTree], at: usize) -> bool {
    matches!((trees.get(at), trees.get(at + 1)),
        (Some(TokenTree::Punct(a)), Some(TokenTree::Punct(b)))
            if a.as_char() == ':' && b.as_char() == ':' && a.spacing() == proc_macro2::Spacing::Joint)
}

fn after_path_separator(trees: &[TokenTree], at: usize) -> bool {
    at >= 2 && is_path_separator(trees, at - 2)
}

/// Where a type's inherent `impl` blocks stand: by crate and the type's
/// full path, the files and lines; and the file that defines the type.
#[derive(Default)]
pub struct ImplSites {
    pub blocks: BTreeMap<(String, String), Vec<(PathBuf, usize)>>,
    pub definitions: BTreeMap<(String, String), PathBuf>,
}

/// Records the inherent `impl` blocks outside test code of every file of
/// `krate`, by the type each names, resolved to the module defining it
/// where its file says (a definition there, a `use`, or `super::`).
pub fn impl_sites(krate: &Crate, sites: &mut ImplSites) {
    for file in krate.files.iter().filter(|f| !f.is_test) {
        let mut finder = ImplFinder {
            module: file.module.clone(),
            items: &file.syntax.items,
            found: Vec::new(),
        };
        finder.items_of(&file.syntax.items);
        for (ty, line) in finder.found {
            sites
                .blocks
                .entry((krate.name.clone(), ty))
                .or_default()
                .push((file.path.clone(), line));
        }
        for item in &file.syntax.items {
            let name = match item {
                Item::Struct(s) => &s.ident,
                Item::Enum(e) => &e.ident,
                Item::Union(u) => &u.ident,
                _ => continue,
            };
            let ty = format!("{}::{name}", file.module);
            sites
                .definitions
                .insert((krate.name.clone(), ty), file.path.clone());
        }
    }
}

struct ImplFinder<'a> {
    module: String,
    items: &'a [Item],
    found: Vec<(String, usize)>,
}

impl ImplFinder<'_> {
    fn items_of(&mut self, items: &[Item]) {
        for item in items {
            if is_test_only(item_attrs(item)) {
                continue;
            }
            let Item::Impl(block) = item else { continue };
            if block.trait_.is_some() {
                continue;
            }
            let Type::Path(ty) = &*block.self_ty else {
                continue;
            };
            let names: Vec<String> = ty
                .path
                .segments
                .iter()
                .map(|s| s.ident.to_string())
                .collect();
            let line = block.impl_token.span.start().line;
            self.found.push((self.resolve(&names), line));
        }
    }

    /// `crate::module::Type` for the type a path names from this file.
    fn resolve(&self, names: &[String]) -> String {
        let mut full: Vec<String> = match names {
            [only] => self
                .imported(only)
                .unwrap_or_else(|| vec!["self".to_owned(), only.clone()]),
            _ => names.to_vec(),
        };
        let mut at: Vec<String> = self.module.split("::").map(str::to_owned).collect();
        match full.first().map(String::as_str) {
            Some("crate") => {
                at.truncate(1);
                full.remove(0);
            }
            Some("self" | "super") => {
                while let Some(step) = full.first() {
                    match step.as_str() {
                        "self" => {}
                        "super" => {
                            at.pop();
                        }
                        _ => break,
                    }
                    full.remove(0);
                }
            }
            _ => {}
        }
        [at, full].concat().join("::")
    }

    /// The full path a name is imported by in this file, if it is.
    fn imported(&self, name: &str) -> Option<Vec<String>> {
        self.items.iter().find_map(|item| {
            let Item::Use(item) = item else { return None };
            use_paths(&item.tree)
                .into_iter()
                .find(|path| path.last().is_some_and(|last| last == name))
        })
    }
}
