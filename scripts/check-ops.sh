#!/usr/bin/env bash
# Checks the operator's files under ops/: the Prometheus rules (`promtool check rules`), their unit
# tests (`promtool test rules`), and every query of the Grafana dashboard (each written into a
# scratch rules file, with the `$tool` variable as `.*`, and checked by promtool's parser).
# Installs Debian's `prometheus` package (which has promtool) when promtool is missing.
# `it::ops` holds the metric names the files use to the ones the code exports.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v promtool >/dev/null; then
    echo "check-ops: installing promtool (Debian's prometheus package)"
    if [ "$(id -u)" = 0 ]; then sudo=""; else sudo="sudo"; fi
    $sudo apt-get update -q >/dev/null
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends prometheus >/dev/null
fi

promtool check rules ops/prometheus/idem.rules.yml
(cd ops/prometheus && promtool test rules idem.rules.test.yml)

scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
python3 - ops/grafana/idem.json "$scratch/dashboard.rules.yml" <<'PY'
import json, sys
dashboard = json.load(open(sys.argv[1]))
rules = []
for panel in dashboard["panels"]:
    for target in panel["targets"]:
        expr = target["expr"].replace("$tool", ".*")
        rules.append(f"      - record: dashboard:panel{panel['id']}:{target['refId']}\n        expr: {json.dumps(expr)}\n")
assert rules, "the dashboard has no queries"
with open(sys.argv[2], "w") as out:
    out.write("groups:\n  - name: dashboard\n    rules:\n" + "".join(rules))
print(f"check-ops: {len(rules)} dashboard queries in {len(dashboard['panels'])} panels")
PY
promtool check rules "$scratch/dashboard.rules.yml"
