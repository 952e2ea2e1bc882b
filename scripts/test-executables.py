#!/usr/bin/env python3
"""Prints the test executables one package's build produced.

usage: scripts/test-executables.py MANIFEST < CARGO_JSON

CARGO_JSON is what `cargo test --no-run --message-format=json...` printed;
MANIFEST is the package's Cargo.toml, as an absolute path. scripts/test.sh
runs the kernels crate's tests this way, from the workspace's own build.
"""

import json
import sys


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    manifest = sys.argv[1]
    found = 0
    for line in sys.stdin:
        if not line.startswith("{"):
            continue
        message = json.loads(line)
        if (
            message.get("reason") == "compiler-artifact"
            and message.get("manifest_path") == manifest
            and message.get("profile", {}).get("test")
            and message.get("executable")
        ):
            print(message["executable"])
            found += 1
    if found == 0:
        print(f"test-executables.py: the build named no test executable of {manifest}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
