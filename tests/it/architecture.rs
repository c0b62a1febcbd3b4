//! `ARCHITECTURE.md` names every source file of the three published crates, and only those: a module
//! added, moved or removed without the map fails here, so the map stays true.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("the workspace root").to_owned()
}

/// Every `.rs` file under `root`, as a path relative to it with `/` separators.
fn sources(root: &Path) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let mut folders = vec![root.to_owned()];
    while let Some(folder) = folders.pop() {
        for entry in std::fs::read_dir(&folder).expect("read a source folder") {
            let path = entry.expect("a folder entry").path();
            if path.is_dir() {
                folders.push(path);
            } else if path.extension().is_some_and(|extension| extension == "rs") {
                let relative = path.strip_prefix(root).expect("under the root");
                found.insert(
                    relative.components().map(|part| part.as_os_str().to_string_lossy()).collect::<Vec<_>>().join("/"),
                );
            }
        }
    }
    found
}

/// The paths in the first column of the table under `heading`: the rooms the map names.
fn rooms(map: &str, heading: &str) -> BTreeSet<String> {
    let section = map.split(heading).nth(1).unwrap_or_else(|| panic!("ARCHITECTURE.md has no section {heading:?}"));
    let section = section.split("\n## ").next().unwrap_or_default();
    section
        .lines()
        .filter_map(|line| line.strip_prefix("| `"))
        .filter_map(|line| line.split('`').next())
        .filter(|path| path.ends_with(".rs"))
        .map(str::to_owned)
        .collect()
}

fn check(krate: &str) {
    let map = std::fs::read_to_string(workspace().join("ARCHITECTURE.md")).expect("read ARCHITECTURE.md");
    let named = rooms(&map, &format!("## The rooms of `{krate}`"));
    let present = sources(&workspace().join(krate).join("src"));
    let unnamed: Vec<_> = present.difference(&named).collect();
    let gone: Vec<_> = named.difference(&present).collect();
    assert!(
        unnamed.is_empty() && gone.is_empty(),
        "ARCHITECTURE.md is out of date for {krate}: name these files and their one job {unnamed:?}, \
         and remove these, which no longer exist {gone:?}"
    );
}

#[test]
fn the_map_names_every_runtime_module() {
    check("idem-runtime");
}

#[test]
fn the_map_names_every_cli_module() {
    check("idem-cli");
}

#[test]
fn the_map_names_every_macro_module() {
    check("idem-macros");
}
