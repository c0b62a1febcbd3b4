//! Every source file under `tests/` is compiled into some target. Cargo builds only the targets
//! `tests/Cargo.toml` names (`autotests = false`), and a target only the files its `mod` tree
//! reaches, so a file outside both would never run — and never say so. This walks that tree from
//! each `path = "…"` of the manifest, through `mod name;` and `#[path = "…"]`, and names every
//! `.rs` file it does not reach. (`ui/` is trybuild's: it compiles each file there on its own.)

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

fn package() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The root file of every target: the manifest's `path = "…"` lines (lib, tests, benches, bins).
fn target_roots(manifest: &str) -> Vec<PathBuf> {
    manifest
        .lines()
        .filter_map(|line| line.trim().strip_prefix("path = \"")?.strip_suffix('"'))
        .map(|path| package().join(path))
        .collect()
}

/// The module files `file` declares, each with whether it is a directory owner (its own `mod`s
/// live beside it: `main.rs`, `lib.rs`, `mod.rs`, a `#[path]` file) or not (they live in a folder
/// named after it).
fn declared_modules(file: &Path, owns_its_folder: bool) -> Vec<(PathBuf, bool)> {
    let text = fs::read_to_string(file).unwrap_or_else(|error| panic!("read {}: {error}", file.display()));
    let folder = file.parent().expect("a file has a folder");
    let children =
        if owns_its_folder { folder.to_owned() } else { folder.join(file.file_stem().expect("a file has a name")) };
    let mut path_attribute = None;
    let mut declared = Vec::new();
    for line in text.lines().map(str::trim) {
        if let Some(path) = line.strip_prefix("#[path = \"").and_then(|rest| rest.strip_suffix("\"]")) {
            path_attribute = Some(folder.join(path));
            continue;
        }
        let item = line.trim_start_matches("pub(crate) ").trim_start_matches("pub(super) ").trim_start_matches("pub ");
        if let Some(name) = item.strip_prefix("mod ").and_then(|rest| rest.strip_suffix(';')) {
            declared.push(match path_attribute.take() {
                Some(path) => (path, true),
                None if children.join(format!("{name}.rs")).is_file() => (children.join(format!("{name}.rs")), false),
                None => (children.join(name).join("mod.rs"), true),
            });
        } else if !line.starts_with("#[") {
            path_attribute = None;
        }
    }
    declared
}

fn rust_files(folder: &Path, found: &mut BTreeSet<PathBuf>) {
    for entry in fs::read_dir(folder).unwrap_or_else(|error| panic!("list {}: {error}", folder.display())) {
        let path = entry.expect("a folder entry").path();
        if path.is_dir() {
            if path != package().join("ui") {
                rust_files(&path, found);
            }
        } else if path.extension().is_some_and(|extension| extension == "rs") {
            found.insert(path.canonicalize().expect("an existing file"));
        }
    }
}

#[test]
fn every_source_file_belongs_to_a_target() {
    let manifest = fs::read_to_string(package().join("Cargo.toml")).expect("read tests/Cargo.toml");
    let mut reached = BTreeSet::new();
    let mut pending: Vec<_> = target_roots(&manifest).into_iter().map(|root| (root, true)).collect();
    while let Some((file, owns_its_folder)) = pending.pop() {
        assert!(file.is_file(), "{} is declared (in tests/Cargo.toml or by a `mod`) but missing", file.display());
        let file = file.canonicalize().expect("an existing file");
        if reached.insert(file.clone()) {
            pending.extend(declared_modules(&file, owns_its_folder));
        }
    }
    assert!(reached.contains(&package().join("it/layout.rs").canonicalize().unwrap()), "the walk missed this file");

    let mut present = BTreeSet::new();
    rust_files(&package(), &mut present);
    let orphans: Vec<_> = present.difference(&reached).map(|file| file.display().to_string()).collect();
    assert!(
        orphans.is_empty(),
        "no target compiles these files, so their tests never run: {orphans:#?}\n\
         declare each as a `mod` of a target (`it/main.rs`, `reliability/main.rs`) or name it in tests/Cargo.toml"
    );
}
