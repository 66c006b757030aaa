//! The privacy crates must be usable without a model runtime: no `burn` package may
//! appear among `privmix-mechanisms`' dependencies, normal or dev, direct or transitive.
//!
//! Checked on the lock file, which lists every package any target of the workspace
//! (or of the packaged crate) resolves to with the dependencies of each: the closure
//! from `privmix-mechanisms` over it contains everything `cargo tree -p
//! privmix-mechanisms -e normal,dev` shows, and more (all platforms, build
//! dependencies), so an empty result here implies an empty `cargo tree … | grep burn`.

use std::collections::{BTreeSet, HashMap};
use std::path::PathBuf;

/// One `[[package]]` of a lock file: name, version, and its dependency entries
/// (`"name"` or `"name version"`, optionally followed by a source).
struct Package {
    name: String,
    version: String,
    dependencies: Vec<String>,
}

fn lock_file() -> String {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    for candidate in [dir.join("Cargo.lock"), dir.join("../Cargo.lock")] {
        if let Ok(text) = std::fs::read_to_string(&candidate) {
            return text;
        }
    }
    panic!("no Cargo.lock beside the crate or its workspace");
}

/// The packages of a lock file (its TOML subset: `[[package]]` tables with `name`,
/// `version` and a `dependencies` array over one or more lines).
fn parse(lock: &str) -> Vec<Package> {
    let mut packages = Vec::new();
    let mut in_dependencies = false;
    for line in lock.lines().map(str::trim) {
        if line == "[[package]]" {
            packages.push(Package {
                name: String::new(),
                version: String::new(),
                dependencies: Vec::new(),
            });
            in_dependencies = false;
            continue;
        }
        let Some(p) = packages.last_mut() else {
            continue;
        };
        let quoted = || line.split('"').nth(1).unwrap_or("").to_string();
        if let Some(rest) = line.strip_prefix("name = ") {
            p.name = rest.trim_matches('"').to_string();
        } else if let Some(rest) = line.strip_prefix("version = ") {
            p.version = rest.trim_matches('"').to_string();
        } else if line.starts_with("dependencies = [") {
            in_dependencies = !line.ends_with(']');
            if line.contains('"') {
                p.dependencies.push(quoted());
            }
        } else if in_dependencies {
            if line.starts_with(']') {
                in_dependencies = false;
            } else if line.starts_with('"') {
                p.dependencies.push(quoted());
            }
        }
    }
    packages
}

/// Every package reachable from `root` (name and version), `root` included.
fn closure(packages: &[Package], root: &str) -> BTreeSet<(String, String)> {
    let mut by_name: HashMap<&str, Vec<&Package>> = HashMap::new();
    for p in packages {
        by_name.entry(p.name.as_str()).or_default().push(p);
    }
    let mut seen = BTreeSet::new();
    let mut stack: Vec<&Package> = by_name.get(root).cloned().unwrap_or_default();
    while let Some(p) = stack.pop() {
        if !seen.insert((p.name.clone(), p.version.clone())) {
            continue;
        }
        for dep in &p.dependencies {
            let mut words = dep.split_whitespace();
            let name = words.next().unwrap_or("");
            let version = words.next();
            for candidate in by_name.get(name).into_iter().flatten() {
                if version.is_none_or(|v| v == candidate.version) {
                    stack.push(candidate);
                }
            }
        }
    }
    seen
}

#[test]
fn no_burn_package_is_reachable_from_mechanisms() {
    let packages = parse(&lock_file());
    let reachable = closure(&packages, "privmix-mechanisms");
    // The parse found the crate and its known dependencies.
    for expected in [
        "privmix-mechanisms",
        "privmix-accountant",
        "privmix-renyi",
        "proptest",
    ] {
        assert!(
            reachable.iter().any(|(n, _)| n == expected),
            "{expected} not found: the lock file was not parsed"
        );
    }
    let burn: Vec<_> = reachable
        .iter()
        .filter(|(n, _)| n.starts_with("burn") || n.starts_with("cubecl"))
        .collect();
    assert!(
        burn.is_empty(),
        "model-runtime packages reachable: {burn:?}"
    );
}

#[test]
fn the_check_sees_burn_where_it_is() {
    // The same walk from a crate that does depend on burn finds it, so an empty
    // result above is not an artefact of the parse.
    let packages = parse(&lock_file());
    if packages.iter().any(|p| p.name == "privmix-models") {
        let reachable = closure(&packages, "privmix-models");
        assert!(reachable.iter().any(|(n, _)| n.starts_with("burn")));
    } else {
        // A packaged crate's own lock file holds no model crate: check the walk on a
        // hand-made lock file instead.
        let lock = "[[package]]\nname = \"a\"\nversion = \"1.0.0\"\ndependencies = [\n \"b\",\n]\n\n\
                    [[package]]\nname = \"b\"\nversion = \"2.0.0\"\ndependencies = [\"burn 0.21.0\"]\n\n\
                    [[package]]\nname = \"burn\"\nversion = \"0.21.0\"\n";
        let reachable = closure(&parse(lock), "a");
        assert!(reachable.contains(&("burn".to_string(), "0.21.0".to_string())));
    }
}
