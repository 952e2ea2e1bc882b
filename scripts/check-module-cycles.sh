#!/usr/bin/env bash
# Checks that no crate of the workspace has a module cycle: within each library and
# binary, every `use` between modules must point one way (cargo-modules'
# `dependencies --acyclic`). Prints each crate target that has a cycle, with the cycle,
# and exits non-zero if any has one.
#
#   scripts/check-module-cycles.sh
#
# Installs cargo-modules (the pinned version) when missing.
set -euo pipefail
cd "$(dirname "$0")/.."

version=0.27.0
if [[ "$(cargo modules --version 2>/dev/null)" != *"$version"* ]]; then
    cargo install --locked "cargo-modules@$version"
fi

# Every library and binary target of the workspace's packages, as
# "package kind name" lines (benches, tests and examples are not checked).
targets="$(cargo metadata --no-deps --format-version 1 | python3 -c '
import json, sys
for p in json.load(sys.stdin)["packages"]:
    for t in p["targets"]:
        for kind in ("lib", "bin"):
            if kind in t["kind"]:
                print(p["name"], kind, t["name"])
')"

failed=0
while read -r package kind name; do
    if [[ "$kind" == lib ]]; then
        selector=(--lib)
    else
        selector=(--bin "$name")
    fi
    # Modules only: an edge is a `use` of one module's item in another. Owns edges (a
    # module declaring its children) are left out, so a child may use its parent.
    if out="$(cargo modules dependencies --package "$package" "${selector[@]}" \
        --no-externs --no-sysroot --no-fns --no-traits --no-types --no-owns \
        --acyclic 2>&1 >/dev/null)"; then
        echo "ok: $package ($kind $name)"
    else
        failed=1
        echo "CYCLE: $package ($kind $name)"
        echo "$out" | sed 's/^/    /'
    fi
done <<< "$targets"
exit "$failed"
