#!/usr/bin/env bash
# Checks that no crate of the workspace has a module cycle: within each library and
# binary, the `use`s between modules must all point one way. Prints each crate target
# with a cycle, and each cycle in it as a chain of modules, and exits non-zero if any.
#
#   scripts/check-module-cycles.sh
#
# cargo-modules (pinned, installed when missing) draws the graph; its own `--acyclic`
# is not the check: it runs on items before they are folded into modules, so a type
# whose method names the type counts as a cycle. Here the graph is modules only (an
# item's edges belong to its module), and a cycle is one along "uses" edges; "owns"
# edges (a module declaring its children) are not uses, so a child may sit below its
# parent, and a parent that uses its children is fine as long as none uses it back.
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

# Reads cargo-modules' DOT on stdin; prints one cycle per strongly connected group of
# modules ("a -> b -> a"); exits 1 if there is any.
find_cycles='
import re, sys
uses = {}
for line in sys.stdin:
    m = re.match(r"\s*\"([^\"]+)\" -> \"([^\"]+)\" \[label=\"uses\"", line)
    if m and m.group(1) != m.group(2):
        uses.setdefault(m.group(1), set()).add(m.group(2))
        uses.setdefault(m.group(2), set())
# Tarjan: the strongly connected components of the uses graph.
index, low, on_stack, stack, groups = {}, {}, set(), [], []
def visit(v):
    index[v] = low[v] = len(index)
    stack.append(v); on_stack.add(v)
    for w in sorted(uses[v]):
        if w not in index:
            visit(w); low[v] = min(low[v], low[w])
        elif w in on_stack:
            low[v] = min(low[v], index[w])
    if low[v] == index[v]:
        group = set()
        while True:
            w = stack.pop(); on_stack.discard(w); group.add(w)
            if w == v: break
        if len(group) > 1: groups.append(group)
sys.setrecursionlimit(100000)
for v in sorted(uses):
    if v not in index: visit(v)
def cycle_through(start, group):
    # Shortest path back to start inside the group (breadth first).
    prev, frontier = {start: None}, [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(uses[v] & group):
                if w == start:
                    path = [v]
                    while prev[path[-1]] is not None: path.append(prev[path[-1]])
                    return list(reversed(path)) + [start]
                if w not in prev:
                    prev[w] = v; nxt.append(w)
        frontier = nxt
for group in groups:
    print(f"{len(group)} modules in one cycle: " + ", ".join(sorted(group)))
    print("  e.g. " + " -> ".join(cycle_through(min(group), group)))
sys.exit(1 if groups else 0)
'

failed=0
while read -r package kind name; do
    if [[ "$kind" == lib ]]; then
        selector=(--lib)
    else
        selector=(--bin "$name")
    fi
    dot="$(cargo modules dependencies --package "$package" "${selector[@]}" \
        --no-externs --no-sysroot --no-fns --no-traits --no-types)"
    if report="$(python3 -c "$find_cycles" <<< "$dot")"; then
        echo "ok: $package ($kind $name)"
    else
        failed=1
        echo "CYCLE: $package ($kind $name)"
        echo "$report" | sed 's/^/    /'
    fi
done <<< "$targets"
exit "$failed"
