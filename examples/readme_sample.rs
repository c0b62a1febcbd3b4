//! The README's rmcp sample is `examples/tickets.rs`, byte for byte: the example is compiled and
//! unit-tested, so this check is what keeps the README's server compilable.

const MARKER: &str = "<!-- examples/tickets.rs -->";

/// The fenced ```rust block right after the marker comment.
fn readme_sample(readme: &str) -> Option<&str> {
    let after_marker = &readme[readme.find(MARKER)? + MARKER.len()..];
    let body = after_marker.trim_start_matches(['\r', '\n']).strip_prefix("```rust\n")?;
    body.find("\n```\n").map(|end| &body[..=end])
}

#[test]
fn the_readme_rmcp_sample_is_the_tickets_example() {
    let root = env!("CARGO_MANIFEST_DIR");
    let readme = std::fs::read_to_string(format!("{root}/../README.md")).expect("README.md is readable");
    let example = std::fs::read_to_string(format!("{root}/tickets.rs")).expect("examples/tickets.rs is readable");
    let sample = readme_sample(&readme).unwrap_or_else(|| panic!("README.md has no ```rust block after `{MARKER}`"));
    if sample != example {
        let line = sample.lines().zip(example.lines()).position(|(a, b)| a != b).map_or_else(
            || format!("the first {} lines agree; one is longer", sample.lines().count().min(example.lines().count())),
            |index| format!("line {} differs", index + 1),
        );
        panic!("README.md's rmcp sample and examples/tickets.rs differ ({line}): copy the example into the README");
    }
}
