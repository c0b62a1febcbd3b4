#!/usr/bin/env bash
# Every feature of idem-runtime alone, the combinations users pick, and none at all: each set
# builds and its unit tests pass (issue 45, item 3). The workspace's own build unifies features
# across its members, so without this a user who enables one feature alone may be the first to
# build it. Prints, per set, the normal dependencies it pulls (idem-runtime included) and the
# seconds it took.
#
#   bash scripts/check-features.sh            # every set
#   bash scripts/check-features.sh redis http # only these sets (comma-separated features each)
#
# The unit tests (`--lib`) are what runs per set, but for the model checks and the differential
# tests of canonical JSON, which no feature touches (about 30 s a set; `cargo test --workspace`
# runs them); the integration tests need features the workspace build gives them and run there
# too. The database-backed unit tests reach the servers `cargo test` does
# (IDEM_TEST_POSTGRES_URL, IDEM_TEST_MYSQL_URL), and skip without them outside CI. A warning in
# idem-runtime's own build of a set fails it (a `cfg` that leaves an item unused, an import only
# one feature needs). That build is the unit tests' (`cfg(test)`); the library a user builds is
# built too for the set with no features, where every feature-gated item is off (about 12 s;
# `.ci/run` builds it with `http-tower` alone as well). Each other set's plain library would
# rebuild its dependencies without the dev-dependencies' features: minutes, not run here.
set -euo pipefail
cd "$(dirname "$0")/.."
log=$(mktemp)
trap 'rm -f "$log"' EXIT

if [ "$#" -gt 0 ]; then
    sets=("$@")
else
    # "" is no features at all (not even the default `sqlite`).
    sets=("" sqlite postgres mysql redis tls rmcp mcp-http mcp-client rig apalis http-tower http metrics
        rmcp,sqlite http,postgres)
fi

report=()
for features in "${sets[@]}"; do
    name=${features:-none}
    args=(-p idem-runtime --no-default-features --locked)
    if [ -n "$features" ]; then
        args+=(--features "$features")
    fi
    echo "== idem-runtime, features [$name]: build and unit tests"
    start=$SECONDS
    cargo test "${args[@]}" --lib -q -- --skip ledger::memory::model --skip canonical::differential 2>&1 | tee "$log"
    if [ -z "$features" ]; then
        cargo build "${args[@]}" --lib -q 2>&1 | tee -a "$log"
    fi
    if grep -q '^warning' "$log"; then
        echo "idem-runtime with features [$name] builds with warnings (above): gate what only some features use" >&2
        exit 1
    fi
    deps=$(cargo tree "${args[@]}" -e normal --prefix none | sed 's/ (\*)$//' | sort -u | wc -l)
    report+=("$(printf '%-16s %4d dependencies %5d s' "[$name]" "$deps" $((SECONDS - start)))")
done

echo "== every feature set built and passed its unit tests"
printf '%s\n' "${report[@]}"
