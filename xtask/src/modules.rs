//! `cargo xtask modules`: the module graph of every crate of the workspace,
//! file by file, from the imports in their sources, and its cycles.
//!
//! An arrow `a.rs → b.rs` is drawn where `a.rs` names an item or module of
//! `b.rs` through a path: `crate::…`, `super::…`, `self::…`, or a `use` of a
//! child module it declares. A path is resolved to the deepest module file
//! it reaches (`crate::layers::KvCache` reaches `layers/mod.rs`, which
//! re-exports it; `crate::layers::kv_cache::KvCache` reaches
//! `layers/kv_cache.rs`), and through re-exports to the file that defines
//! the name (a `pub use` is a module's public face, not an arrow of its
//! own). Declaring a child (`mod child;`) is not an arrow either.
//! Test modules (`#[cfg(test)] mod …` to the end of a file, `tests.rs`
//! files) and binaries under `src/bin/` are left out. A cycle is a set of
//! files that reach each other through arrows (a strongly connected
//! component of two or more); `cargo xtask test` fails on any.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};

/// The crates whose sources are read.
const CRATES: [&str; 10] = [
    "simd",
    "renyi",
    "accountant",
    "mixing",
    "models",
    "ensemble",
    "mechanisms",
    "bench",
    "cli",
    "xtask",
];

/// One crate's module files and the arrows between them.
#[derive(Debug, Default)]
pub(crate) struct Graph {
    /// Module path (`["layers", "kv_cache"]`) → file, relative to `src/`.
    files: BTreeMap<Vec<String>, String>,
    /// Lines of each file.
    lines: BTreeMap<String, usize>,
    /// `from → to` with the names `from` takes from `to`.
    arrows: BTreeMap<(String, String), BTreeSet<String>>,
    /// `(file, name)` → the absolute path a `pub use` of `file` exports as
    /// `name`.
    reexports: BTreeMap<(String, String), Vec<String>>,
}

/// Runs the task: prints every crate's files, arrows and cycles; an error
/// if any crate has a cycle.
pub(crate) fn run(verbose: bool) -> Result<(), String> {
    let root = crate::workspace::workspace_root();
    let mut report = String::new();
    let mut cycles = 0;
    for name in CRATES {
        let graph = Graph::of_crate(&root.join(name).join("src"))?;
        let found = graph.cycles();
        cycles += found.len();
        report.push_str(&graph.render(name, verbose, &found));
    }
    print!("{report}");
    if cycles > 0 {
        return Err(format!("{cycles} module cycle(s), listed above"));
    }
    println!("no module cycles in {} crates", CRATES.len());
    Ok(())
}

impl Graph {
    /// Reads the crate whose sources are under `src`.
    pub(crate) fn of_crate(src: &Path) -> Result<Self, String> {
        let mut graph = Graph::default();
        let mut texts = Vec::new();
        for file in rust_files(src)? {
            let rel = file
                .strip_prefix(src)
                .map_err(|e| e.to_string())?
                .to_string_lossy()
                .replace('\\', "/");
            if rel.starts_with("bin/") || rel.ends_with("/tests.rs") || rel == "tests.rs" {
                continue;
            }
            let text = fs::read_to_string(&file)
                .map_err(|e| format!("cannot read {}: {e}", file.display()))?;
            graph.lines.insert(rel.clone(), text.lines().count());
            graph.files.insert(module_path(&rel), rel.clone());
            texts.push((rel, without_tests(&text)));
        }
        let found: Vec<(String, Vec<Found>)> = texts
            .iter()
            .map(|(rel, text)| (rel.clone(), paths(text, &declared_children(text))))
            .collect();
        for (rel, paths) in &found {
            for p in paths.iter().filter(|p| p.reexport) {
                if let Some(absolute) = absolute(rel, &p.path, &p.children) {
                    graph
                        .reexports
                        .insert((rel.clone(), p.name.clone()), absolute);
                }
            }
        }
        for (rel, paths) in &found {
            for p in paths.iter().filter(|p| !p.reexport) {
                let Some(absolute) = absolute(rel, &p.path, &p.children) else {
                    continue;
                };
                if let Some(target) = graph.defining_file(&absolute, 8)
                    && &target != rel
                {
                    graph
                        .arrows
                        .entry((rel.clone(), target))
                        .or_default()
                        .insert(p.name.clone());
                }
            }
        }
        Ok(graph)
    }

    /// The file that defines what the absolute `path` names: its deepest
    /// module file, or, where that file re-exports the name, the file the
    /// re-export leads to (followed up to `depth` times).
    fn defining_file(&self, path: &[String], depth: usize) -> Option<String> {
        let n = (0..=path.len())
            .rev()
            .find(|&n| self.files.contains_key(&path[..n]))?;
        let file = self.files[&path[..n]].clone();
        if depth > 0
            && path.len() == n + 1
            && let Some(target) = self.reexports.get(&(file.clone(), path[n].clone()))
        {
            return self.defining_file(target, depth - 1).or(Some(file));
        }
        Some(file)
    }

    /// The sets of two or more files that reach each other (Tarjan's
    /// strongly connected components), each sorted.
    pub(crate) fn cycles(&self) -> Vec<Vec<String>> {
        let nodes: Vec<&String> = self.lines.keys().collect();
        let index_of: BTreeMap<&String, usize> =
            nodes.iter().enumerate().map(|(i, n)| (*n, i)).collect();
        let mut next: Vec<Vec<usize>> = vec![Vec::new(); nodes.len()];
        for (from, to) in self.arrows.keys() {
            if let (Some(&a), Some(&b)) = (index_of.get(from), index_of.get(to)) {
                next[a].push(b);
            }
        }
        let mut tarjan = Tarjan::new(nodes.len());
        for v in 0..nodes.len() {
            if tarjan.index[v].is_none() {
                tarjan.visit(v, &next);
            }
        }
        tarjan
            .components
            .into_iter()
            .filter(|c| c.len() > 1)
            .map(|c| {
                let mut files: Vec<String> = c.into_iter().map(|i| nodes[i].clone()).collect();
                files.sort();
                files
            })
            .collect()
    }

    /// The crate's section of the report.
    fn render(&self, name: &str, verbose: bool, cycles: &[Vec<String>]) -> String {
        let mut s = String::new();
        let total: usize = self.lines.values().sum();
        let _ = writeln!(
            s,
            "## {name}: {} files, {total} lines, {} arrows, {} cycle(s)",
            self.lines.len(),
            self.arrows.len(),
            cycles.len()
        );
        for (i, cycle) in cycles.iter().enumerate() {
            let _ = writeln!(s, "cycle {}: {}", i + 1, cycle.join(", "));
            for ((from, to), names) in &self.arrows {
                if cycle.contains(from) && cycle.contains(to) {
                    let names: Vec<&str> = names.iter().map(String::as_str).collect();
                    let _ = writeln!(s, "  {from} -> {to}: {}", names.join(", "));
                }
            }
        }
        if verbose {
            for (file, lines) in &self.lines {
                let targets: Vec<&str> = self
                    .arrows
                    .keys()
                    .filter(|(from, _)| from == file)
                    .map(|(_, to)| to.as_str())
                    .collect();
                let _ = writeln!(s, "{file} ({lines} lines) -> {}", targets.join(", "));
            }
        }
        s
    }
}

/// A path `from`'s text names, relative to it.
struct Found {
    path: Vec<String>,
    /// The name it takes (or exports) at its end.
    name: String,
    /// Part of a `pub use` (or `pub(crate) use`): a re-export.
    reexport: bool,
    /// The child modules its file declares (the roots of bare `use` paths).
    children: BTreeSet<String>,
}

/// The absolute module path of `path`, relative to the file `rel`.
fn absolute(rel: &str, path: &[String], children: &BTreeSet<String>) -> Option<Vec<String>> {
    let here = module_path(rel);
    Some(match path.first().map(String::as_str) {
        Some("crate") => path[1..].to_vec(),
        Some("self") => [here, path[1..].to_vec()].concat(),
        Some("super") => {
            let ups = path.iter().take_while(|s| *s == "super").count();
            if ups > here.len() {
                return None;
            }
            [here[..here.len() - ups].to_vec(), path[ups..].to_vec()].concat()
        }
        Some(first) if children.contains(first) => [here, path.to_vec()].concat(),
        _ => return None,
    })
}

/// Tarjan's strongly connected components, iterative enough for module
/// graphs (recursion depth ≤ the number of files).
struct Tarjan {
    index: Vec<Option<usize>>,
    low: Vec<usize>,
    on_stack: Vec<bool>,
    stack: Vec<usize>,
    counter: usize,
    components: Vec<Vec<usize>>,
}

impl Tarjan {
    fn new(n: usize) -> Self {
        Self {
            index: vec![None; n],
            low: vec![0; n],
            on_stack: vec![false; n],
            stack: Vec::new(),
            counter: 0,
            components: Vec::new(),
        }
    }

    fn visit(&mut self, v: usize, next: &[Vec<usize>]) {
        self.index[v] = Some(self.counter);
        self.low[v] = self.counter;
        self.counter += 1;
        self.stack.push(v);
        self.on_stack[v] = true;
        for &w in &next[v] {
            match self.index[w] {
                None => {
                    self.visit(w, next);
                    self.low[v] = self.low[v].min(self.low[w]);
                }
                Some(iw) if self.on_stack[w] => self.low[v] = self.low[v].min(iw),
                Some(_) => {}
            }
        }
        if Some(self.low[v]) == self.index[v] {
            let mut component = Vec::new();
            while let Some(w) = self.stack.pop() {
                self.on_stack[w] = false;
                component.push(w);
                if w == v {
                    break;
                }
            }
            self.components.push(component);
        }
    }
}

/// Every `.rs` file under `dir`, sorted.
fn rust_files(dir: &Path) -> Result<Vec<PathBuf>, String> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        let entries = fs::read_dir(&d).map_err(|e| format!("cannot list {}: {e}", d.display()))?;
        for entry in entries {
            let path = entry.map_err(|e| e.to_string())?.path();
            if path.is_dir() {
                todo.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    out.sort();
    Ok(out)
}

/// The module path of the file `rel` (relative to `src/`).
fn module_path(rel: &str) -> Vec<String> {
    let stem = rel.trim_end_matches(".rs");
    let mut parts: Vec<String> = stem.split('/').map(str::to_string).collect();
    if matches!(
        parts.last().map(String::as_str),
        Some("mod" | "lib" | "main")
    ) {
        parts.pop();
    }
    parts
}

/// `text` without its test module: from a `#[cfg(test)]` line followed by
/// a `mod name {` line to the end.
fn without_tests(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    let cut = (0..lines.len()).find(|&i| {
        lines[i].trim() == "#[cfg(test)]"
            && lines[i + 1..]
                .iter()
                .map(|l| l.trim())
                .find(|l| !l.starts_with("#["))
                .is_some_and(|l| l.starts_with("mod ") && l.ends_with('{'))
    });
    lines[..cut.unwrap_or(lines.len())].join("\n")
}

/// The child modules `text` declares (`mod x;`, `pub mod x;`, …).
fn declared_children(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter_map(|l| {
            let l = l.trim();
            let rest = l.strip_prefix("pub(crate) ").unwrap_or(l);
            let rest = rest.strip_prefix("pub ").unwrap_or(rest);
            let name = rest.strip_prefix("mod ")?.strip_suffix(';')?;
            Some(name.trim().to_string())
        })
        .collect()
}

/// The module paths `text` names, each with the name it takes at its end:
/// `crate::`/`super::`/`self::` paths anywhere outside comments, and the
/// paths of `use` declarations (brace groups expanded).
fn paths(text: &str, children: &BTreeSet<String>) -> Vec<Found> {
    let mut out: Vec<(Vec<String>, String, bool)> = Vec::new();
    let code: String = text
        .lines()
        .map(|l| match l.find("//") {
            Some(i) => &l[..i],
            None => l,
        })
        .collect::<Vec<_>>()
        .join("\n");
    // `use` declarations, to their semicolon.
    let mut rest = code.as_str();
    while let Some(i) = find_use(rest) {
        let decl = &rest[i..];
        let end = decl.find(';').unwrap_or(decl.len());
        let (reexport, body) = match decl.strip_prefix("pub") {
            Some(after) => (true, after[after.find("use").unwrap_or(0)..].to_string()),
            None => (false, decl[..].to_string()),
        };
        let end_in_body = body.find(';').unwrap_or(body.len());
        let body = body[..end_in_body]
            .trim_start_matches("use")
            .trim()
            .to_string();
        let mut expanded = Vec::new();
        expand_use(&body, &[], &mut expanded);
        out.extend(expanded.into_iter().map(|(p, n)| (p, n, reexport)));
        rest = &decl[end..];
    }
    // Other qualified paths.
    let bytes = code.as_bytes();
    for start in ["crate::", "super::", "self::"] {
        let mut from = 0;
        while let Some(i) = code[from..].find(start) {
            let at = from + i;
            from = at + start.len();
            if at > 0 && (bytes[at - 1].is_ascii_alphanumeric() || bytes[at - 1] == b'_') {
                continue;
            }
            if at >= 2 && &code[at - 2..at] == "::" {
                continue;
            }
            let path: Vec<String> = code[at..]
                .split(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
                .next()
                .unwrap_or("")
                .split("::")
                .filter(|s| !s.is_empty())
                .map(str::to_string)
                .collect();
            if path.len() > 1 {
                let name = path.last().cloned().unwrap_or_default();
                // Inside a `use` it was read above, with its re-export flag.
                if !inside_use(&code, at) {
                    out.push((path, name, false));
                }
            }
        }
    }
    out.into_iter()
        .filter(|(p, _, _)| {
            p.first().is_some_and(|f| {
                matches!(f.as_str(), "crate" | "super" | "self") || children.contains(f)
            })
        })
        .map(|(path, name, reexport)| Found {
            path,
            name,
            reexport,
            children: children.clone(),
        })
        .collect()
}

/// Whether position `at` of `code` is inside a `use` declaration.
fn inside_use(code: &str, at: usize) -> bool {
    let before = &code[..at];
    let stmt_start = before.rfind([';', '}']).map_or(0, |i| i + 1);
    let stmt = before[stmt_start..].trim_start();
    let stmt = stmt.strip_prefix("pub(crate)").unwrap_or(stmt);
    let stmt = stmt.strip_prefix("pub").unwrap_or(stmt).trim_start();
    stmt.starts_with("use ")
        || before[stmt_start..].contains("use ") && !before[stmt_start..].contains('=')
}

/// The position of the next `use` declaration in `s`.
fn find_use(s: &str) -> Option<usize> {
    let mut from = 0;
    while let Some(i) = s[from..].find("use ") {
        let at = from + i;
        let before = s[..at].chars().next_back();
        if before.is_none_or(|c| c == '\n' || c == ' ' || c == '\t' || c == '{' || c == ';') {
            let line_start = s[..at].rfind('\n').map_or(0, |n| n + 1);
            let prefix = s[line_start..at].trim();
            if prefix.is_empty() {
                return Some(at);
            }
            if prefix.starts_with("pub") {
                return Some(line_start + s[line_start..].find("pub").unwrap_or(0));
            }
        }
        from = at + 4;
    }
    None
}

/// Expands a `use` tree (`a::b::{c, d::e as f, g::*}`) under `prefix`.
fn expand_use(tree: &str, prefix: &[String], out: &mut Vec<(Vec<String>, String)>) {
    let tree = tree.trim();
    if tree.is_empty() {
        return;
    }
    if let Some(open) = tree.find('{') {
        let head: Vec<String> = tree[..open]
            .split("::")
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_string)
            .collect();
        let close = tree.rfind('}').unwrap_or(tree.len());
        let inner = &tree[open + 1..close];
        let base = [prefix.to_vec(), head].concat();
        for part in split_top_level(inner) {
            expand_use(part, &base, out);
        }
        return;
    }
    let path = tree.split(" as ").next().unwrap_or(tree);
    let glob = path.trim_end().ends_with('*');
    let mut full = prefix.to_vec();
    full.extend(
        path.split("::")
            .map(str::trim)
            .filter(|s| !s.is_empty() && *s != "*")
            .map(str::to_string),
    );
    if full.last().is_some_and(|s| s == "self") {
        full.pop();
    }
    if glob && !full.is_empty() {
        out.push((full, "*".to_string()));
    } else if full.len() > 1 {
        let name = full.last().cloned().unwrap_or_default();
        out.push((full, name));
    }
}

/// `s` split at its top-level commas (not inside braces).
fn split_top_level(s: &str) -> Vec<&str> {
    let (mut depth, mut start, mut parts) = (0usize, 0, Vec::new());
    for (i, c) in s.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                parts.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&s[start..]);
    parts
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A crate in a temporary folder, from `(relative path, text)` pairs.
    fn crate_of(files: &[(&str, &str)]) -> (tempdir::Dir, Graph) {
        let dir = tempdir::Dir::new();
        for (rel, text) in files {
            let path = dir.0.join(rel);
            fs::create_dir_all(path.parent().unwrap()).unwrap();
            fs::write(path, text).unwrap();
        }
        let graph = Graph::of_crate(&dir.0).unwrap();
        (dir, graph)
    }

    mod tempdir {
        /// A fresh folder under the system's temporary folder, removed on drop.
        pub struct Dir(pub std::path::PathBuf);

        impl Dir {
            pub fn new() -> Self {
                use std::sync::atomic::{AtomicUsize, Ordering};
                static N: AtomicUsize = AtomicUsize::new(0);
                let path = std::env::temp_dir().join(format!(
                    "xtask-modules-{}-{}",
                    std::process::id(),
                    N.fetch_add(1, Ordering::Relaxed)
                ));
                std::fs::create_dir_all(&path).unwrap();
                Self(path)
            }
        }

        impl Drop for Dir {
            fn drop(&mut self) {
                let _ = std::fs::remove_dir_all(&self.0);
            }
        }
    }

    #[test]
    fn finds_a_cycle_through_super_and_crate_paths() {
        let (_d, g) = crate_of(&[
            ("lib.rs", "mod a;\nmod b;\nmod c;\n"),
            ("a.rs", "use crate::b::{Thing, other::Deep};\n"),
            ("b.rs", "pub mod other;\nfn f() { crate::a::g(); }\n"),
            ("b/other.rs", "use super::super::c::X;\n"),
            ("c.rs", "pub struct X;\n"),
        ]);
        assert_eq!(
            g.cycles(),
            vec![vec!["a.rs".to_string(), "b.rs".to_string()]]
        );
        assert!(
            g.arrows
                .contains_key(&("b/other.rs".to_string(), "c.rs".to_string()))
        );
        assert!(
            g.arrows
                .contains_key(&("a.rs".to_string(), "b/other.rs".to_string()))
        );
    }

    #[test]
    fn reexports_lead_to_the_defining_file_and_tests_are_left_out() {
        let (_d, g) = crate_of(&[
            (
                "lib.rs",
                "pub mod m;\npub use m::Item;\nfn f() { crate::m::Item; }\n",
            ),
            (
                "m/mod.rs",
                "mod leaf;\npub use leaf::Item;\n#[cfg(test)]\nmod tests {\n    use crate::Item;\n}\n",
            ),
            ("m/leaf.rs", "pub struct Item; // crate::m::Item\n"),
        ]);
        assert!(g.cycles().is_empty(), "{:?}", g.arrows);
        let arrows: Vec<&(String, String)> = g.arrows.keys().collect();
        assert_eq!(
            arrows,
            vec![&("lib.rs".to_string(), "m/leaf.rs".to_string())]
        );
    }

    #[test]
    fn a_child_naming_its_parent_closes_a_cycle() {
        let (_d, g) = crate_of(&[
            ("lib.rs", "mod p;\n"),
            ("p.rs", "mod q;\nuse q::Q;\npub struct P;\n"),
            ("p/q.rs", "use super::P;\npub struct Q;\n"),
        ]);
        assert_eq!(
            g.cycles(),
            vec![vec!["p.rs".to_string(), "p/q.rs".to_string()]]
        );
    }
}
