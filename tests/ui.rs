//! Compile-time behaviour of `#[idempotent]` and `#[audit_idempotent]`: what compiles, and the
//! error a user sees for each mistake. Regenerate the `.stderr` files after a deliberate change
//! with `TRYBUILD=overwrite cargo test -p idem-tests --test ui`, then read every one of them.

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.pass("ui/pass/*.rs");
    t.compile_fail("ui/fail/*.rs");
}
