#!/usr/bin/env bash
# The API docs build without a warning with no features, the default ones and all of them, and
# the docs.rs build (nightly rustdoc, `--cfg docsrs`, every feature) marks each feature-gated
# item with the feature it needs (issue 45, item 2).
#
# docs.rs builds with a nightly rustdoc; here only stable exists, so the docs.rs build is
# imitated with RUSTC_BOOTSTRAP=1, which lets this stable rustdoc accept `feature(doc_cfg)`. Some
# dependencies' build scripts (proc-macro2's, thiserror's) read RUSTC_BOOTSTRAP too and would
# build differently under it, so this build has a target directory of its own
# (target/docsrs): the crates' own builds and tests never see it.
set -euo pipefail
cd "$(dirname "$0")/.."

echo "== cargo doc: no features, default features, all features (warnings are errors)"
RUSTDOCFLAGS="-D warnings" cargo doc --no-deps -p idem-runtime --no-default-features --locked
RUSTDOCFLAGS="-D warnings" cargo doc --no-deps --workspace --locked
RUSTDOCFLAGS="-D warnings" cargo doc --no-deps --workspace --all-features --locked

echo "== the docs.rs build of idem-runtime (every feature, --cfg docsrs): each gated item says its feature"
docsrs=${CARGO_TARGET_DIR:-target}/docsrs
RUSTC_BOOTSTRAP=1 RUSTDOCFLAGS="--cfg docsrs -D warnings" CARGO_TARGET_DIR="$docsrs" \
    cargo doc --no-deps -p idem-runtime --all-features --locked
docs=$docsrs/doc/idem_runtime
failed=0
badge() {
    local page=$1 needs=$2
    if ! grep -q "Available on <strong>crate features\? $needs</strong> only" "$docs/$page"; then
        echo "$docs/$page does not say it needs $needs (feature(doc_cfg) on docs.rs)" >&2
        failed=1
    fi
}
badge http/struct.IdempotencyLayer.html '<code>http-tower</code>'
badge http/struct.IdempotencyKey.html '<code>http-tower</code>'
badge mcp/index.html '<code>rmcp</code>'
badge mcp/fn.require_bearer.html '<code>rmcp</code> and <code>mcp-http</code>'
badge mcp/client/struct.IdempotentClient.html '<code>rmcp</code> and <code>mcp-client</code>'
badge rig/struct.Idempotent.html '<code>rig</code>'
badge apalis/struct.IdemLayer.html '<code>apalis</code>'
badge ledger/redis/struct.RedisLedger.html '<code>redis</code>'
badge ledger/sea/struct.SeaOrmLedger.html '<code>sqlite</code> or <code>postgres</code> or <code>mysql</code>'
badge metrics/index.html '<code>metrics</code>'
# The crate's front page lists every feature the manifest declares (the internal `_sea` and
# `default` aside), and no feature it does not.
declared=$(sed -n '/^\[features\]/,/^\[/p' idem-runtime/Cargo.toml | grep -oE '^[a-z][a-z0-9-]* =' | tr -d ' =' \
    | grep -vx default | sort)
listed=$(grep -oE '^//! \| `[a-z][a-z0-9-]*` \|' idem-runtime/src/lib.rs | grep -oE '`[^`]*`' | tr -d '`' | sort)
if [ -z "$declared" ] || [ "$(wc -l <<<"$declared")" -lt 5 ]; then
    echo "could not read idem-runtime's features from its Cargo.toml (found: ${declared:-none})" >&2
    failed=1
elif [ "$declared" != "$listed" ]; then
    echo "idem-runtime/src/lib.rs: the features table lists [$(echo $listed)], the manifest declares [$(echo $declared)]" >&2
    failed=1
fi
if [ "$failed" -ne 0 ]; then
    exit 1
fi
echo "every gated item checked says its feature; the features table lists every feature"
