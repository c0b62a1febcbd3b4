//! What a published project states (issue 45, item 5): the Rust version the README and the
//! changelog name is the `rust-version` every crate's manifest requires, and each published crate
//! ships both licence files the workspace's licence names. (`cargo package` in `.ci/run` builds
//! each crate from its package.)

use idem_tests::workspace_file as file;

/// The workspace's `rust-version`, and that every published crate inherits it.
fn rust_version() -> String {
    let workspace = file("Cargo.toml");
    let version = workspace
        .lines()
        .find_map(|line| line.strip_prefix("rust-version = \"")?.strip_suffix('"'))
        .expect("the workspace states a rust-version");
    for manifest in ["idem-macros/Cargo.toml", "idem-runtime/Cargo.toml", "idem-cli/Cargo.toml"] {
        assert!(
            file(manifest).contains("rust-version.workspace = true"),
            "{manifest} does not inherit the rust-version"
        );
    }
    version.to_owned()
}

#[test]
fn the_readme_and_the_changelog_state_the_rust_version_the_crates_require() {
    let version = rust_version();
    let stated = format!("Rust {version} or later");
    assert!(file("README.md").contains(&stated), "the README does not say \"{stated}\"");
    assert!(file("CHANGELOG.md").contains(&format!("Supported Rust: {version} or later")), "the changelog does not");
}

#[test]
fn each_published_crate_ships_both_licence_files() {
    assert!(file("Cargo.toml").contains("license = \"MIT OR Apache-2.0\""), "the licence changed: update this test");
    for licence in ["LICENSE-MIT", "LICENSE-APACHE"] {
        let text = file(licence);
        for krate in ["idem-macros", "idem-runtime", "idem-cli"] {
            assert_eq!(file(&format!("{krate}/{licence}")), text, "{krate}/{licence} is not the workspace's");
            let manifest = file(&format!("{krate}/Cargo.toml"));
            let include = manifest.lines().find(|line| line.starts_with("include = ")).unwrap_or_default();
            assert!(include.contains(&format!("\"/{licence}\"")), "{krate} does not include {licence}: {include}");
        }
    }
    assert!(file("LICENSE-APACHE").contains("Version 2.0, January 2004"), "LICENSE-APACHE is not the Apache-2.0 text");
    assert!(
        file("LICENSE-MIT").contains("Permission is hereby granted, free of charge"),
        "LICENSE-MIT is not the MIT text"
    );
}
