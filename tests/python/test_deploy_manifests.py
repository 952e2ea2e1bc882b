"""deploy/: the Helm chart renders, and every manifest it renders validates
offline against the Kubernetes schemas; the chart, the container build file
and the Grafana dashboard use only real flags and real metric names.

- `helm lint` and `helm template` (helm from scripts/install-helm.sh) over
  several value sets;
- every built-in kind against the Kubernetes OpenAPI schemas of the oldest
  and newest versions the chart supports (`kubernetes-validate`, strict:
  unknown fields fail), with a negative control showing the validator
  rejects a misspelt field;
- HTTPRoute is a CRD: it is validated against the JSON schema generated
  from the Gateway API's CRDs (`@kubernetes-models/gateway-api`, npm), with
  a negative control;
- InferencePool's CRD schema is in no package of the registries reachable
  here: it is checked against the fields of its v1 API written out below (a
  structural check, NOT the upstream CRD schema), and both for consistency
  with the Deployment (selector, port);
- the server's arguments against `switchyard serve --help`, the policy in
  the ConfigMap with `switchyard policy check`, the grace period against
  `--drain-seconds`, the dashboard's and autoscaler's metric names against
  the names the Rust sources export.

The container image itself is not built here (no container runtime on these
machines); its build file is checked for its structure only.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "switchyard"
DOCKERFILE = ROOT / "deploy" / "Dockerfile"
DASHBOARD = ROOT / "deploy" / "grafana" / "switchyard-dashboard.json"
# The chart's kubeVersion floor and the newest schemas kubernetes-validate has.
KUBE_VERSIONS = ["1.27", kubernetes_validate.latest_version()]

VALUE_SETS = {
    "defaults": [],
    "pool": ["--set", "inferencePool.enabled=true"],
    "fixed-size": ["--set", "autoscaling.enabled=false", "--set", "server.ramBudgetMb=3072",
                   "--set", "server.threads=0", "--set", "server.drainSeconds=90",
                   "--set", "server.preStopSleepSeconds=10"],
    "external-secret": ["--set", "secrets.create=false", "--set", "secrets.existingSecret=prod-keys",
                        "--set", "modelRepository.existingClaim=",
                        "--set", "modelRepository.create.enabled=true",
                        "--set", "inferencePool.enabled=true",
                        "--set", "inferencePool.httpRoute.gatewayNamespace=gateways"],
    "no-policy-no-admin": ["--set", "policy.enabled=false", "--set", "admin.enabled=false"],
}


@pytest.fixture(scope="session")
def helm() -> str:
    for candidate in (os.environ.get("HELM"), str(ROOT / ".venv" / "bin" / "helm"), shutil.which("helm")):
        if candidate and Path(candidate).is_file():
            return candidate
    pytest.fail("helm is not installed: run scripts/setup.sh (it runs scripts/install-deploy-tools.sh)")


@pytest.fixture(scope="session")
def gateway_models() -> Path:
    path = Path(os.environ.get("GATEWAY_MODELS_DIR", ROOT / ".venv" / "node" / "node_modules"
                               / "@kubernetes-models" / "gateway-api"))
    if not (path / "package.json").is_file() or not shutil.which("node"):
        pytest.fail(f"{path} or node is missing: run scripts/setup.sh "
                    "(it runs scripts/install-deploy-tools.sh)")
    return path


# Validates the JSON resource on stdin with the HTTPRoute model's schema;
# prints `ok` or `invalid <reason>`.
VALIDATE_HTTPROUTE = """
import { pathToFileURL } from "node:url";
import fs from "node:fs";
const { HTTPRoute } = await import(pathToFileURL(process.argv[2]).href);
const doc = JSON.parse(fs.readFileSync(0, "utf8"));
try { new HTTPRoute(doc).validate(); console.log("ok"); }
catch (e) { console.log("invalid " + e.message); }
"""


def validate_http_route(gateway_models: Path, route: dict, tmp_path: Path) -> str:
    script = tmp_path / "validate_httproute.mjs"
    script.write_text(VALIDATE_HTTPROUTE)
    model = gateway_models / "gateway.networking.k8s.io" / "v1" / "HTTPRoute.js"
    proc = subprocess.run(["node", str(script), str(model)], input=json.dumps(route),
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def render(helm: str, values: list[str]) -> list[dict]:
    proc = subprocess.run([helm, "template", "demo", str(CHART), "--namespace", "serving", *values],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


@pytest.fixture(scope="session")
def rendered(helm) -> dict[str, list[dict]]:
    return {name: render(helm, values) for name, values in VALUE_SETS.items()}


def one(docs: list[dict], kind: str, name_suffix: str = "") -> dict:
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"].endswith(name_suffix)]
    assert len(found) == 1, (kind, name_suffix, [d["metadata"]["name"] for d in found])
    return found[0]


def container(docs: list[dict]) -> dict:
    return one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]


def test_the_chart_lints(helm):
    proc = subprocess.run([helm, "lint", "--strict", str(CHART)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_every_builtin_manifest_validates_against_the_kubernetes_schemas(rendered):
    validated = set()
    for name, docs in rendered.items():
        for doc in docs:
            if doc["apiVersion"].startswith(("inference.networking.k8s.io/", "gateway.networking.k8s.io/")):
                continue
            for version in KUBE_VERSIONS:
                try:
                    kubernetes_validate.validate(doc, version, strict=True)
                except kubernetes_validate.ValidationError as e:
                    pytest.fail(f"{name}: {doc['kind']} {doc['metadata']['name']} is invalid for "
                                f"Kubernetes {version}: {e.message} at {list(e.path)}")
            validated.add(doc["kind"])
    assert validated == {"Deployment", "Service", "ConfigMap", "Secret", "HorizontalPodAutoscaler",
                         "PersistentVolumeClaim"}


def test_the_validator_rejects_a_misspelt_field(rendered):
    deployment = json.loads(json.dumps(one(rendered["defaults"], "Deployment")))
    spec = deployment["spec"]["template"]["spec"]
    spec["terminationGracePeriod"] = spec.pop("terminationGracePeriodSeconds")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBE_VERSIONS[-1], strict=True)


def serve_flags(switchyard_bin: Path) -> set[str]:
    out = subprocess.run([str(switchyard_bin), "serve", "--help"], capture_output=True, text=True,
                         check=True).stdout
    return set(re.findall(r"(--[a-z][a-z0-9-]*)", out))


def test_the_server_gets_only_real_flags_and_its_drain_fits_the_grace_period(rendered, switchyard_bin):
    flags = serve_flags(switchyard_bin)
    for name, docs in rendered.items():
        deployment = one(docs, "Deployment")
        pod = deployment["spec"]["template"]["spec"]
        c = container(docs)
        args = c["args"]
        assert args[0] == "serve"
        used = {a for a in args if a.startswith("--")}
        assert used <= flags, (name, used - flags)
        drain = int(args[args.index("--drain-seconds") + 1])
        stop_hook = c["lifecycle"]["preStop"]["exec"]["command"]
        assert stop_hook[0] == "sleep"
        pre_stop = int(stop_hook[1])
        # preStop, then SIGTERM and the server's drain, then a margin to exit.
        assert pod["terminationGracePeriodSeconds"] == pre_stop + drain + 5, name
        assert c["readinessProbe"]["httpGet"]["path"] == "/ready"
        assert c["livenessProbe"]["httpGet"]["path"] == "/health"
        assert c["startupProbe"]["httpGet"]["path"] == "/health"
        # Non-root, read-only, the model repository from a read-only volume.
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["runAsUser"] != 0
        assert c["securityContext"]["readOnlyRootFilesystem"] is True
        assert c["securityContext"]["allowPrivilegeEscalation"] is False
        models = next(m for m in c["volumeMounts"] if m["mountPath"] == "/models")
        assert models["readOnly"] is True
        assert args[args.index("--repo") + 1] == "/models"
    fixed = rendered["fixed-size"]
    args = container(fixed)["args"]
    assert args[args.index("--ram-budget-mb") + 1] == "3072"
    assert "--threads" not in args
    assert one(fixed, "Deployment")["spec"]["replicas"] == 2
    assert not [d for d in fixed if d["kind"] == "HorizontalPodAutoscaler"]
    assert "replicas" not in one(rendered["defaults"], "Deployment")["spec"], "the HPA owns replicas"


def test_the_policy_in_the_configmap_is_valid_and_its_keys_come_from_the_secret(rendered, switchyard_bin, tmp_path):
    docs = rendered["defaults"]
    policy = one(docs, "ConfigMap", "-policy")["data"]["policy.toml"]
    secret = one(docs, "Secret")["stringData"]
    c = container(docs)
    assert c["args"][c["args"].index("--policy") + 1] == "/etc/switchyard/policy/policy.toml"
    mount = next(m for m in c["volumeMounts"] if m["name"] == "policy")
    # A subPath mount would never see ConfigMap updates (no hot reload).
    assert mount["mountPath"] == "/etc/switchyard/policy" and "subPath" not in mount
    assert "SWITCHYARD_ADMIN_TOKEN" in secret
    variables = re.findall(r'"env:([A-Z0-9_]+)"', policy)
    assert variables and set(variables) <= set(secret), (variables, secret.keys())
    path = tmp_path / "policy.toml"
    path.write_text(policy)
    proc = subprocess.run([str(switchyard_bin), "policy", "check", str(path)], capture_output=True,
                          text=True, env={**os.environ, **secret})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # Without the key in the environment, the policy does not load.
    proc = subprocess.run([str(switchyard_bin), "policy", "check", str(path)], capture_output=True,
                          text=True, env={k: v for k, v in os.environ.items() if k not in secret})
    assert proc.returncode != 0
    external = container(rendered["external-secret"])
    assert external["envFrom"] == [{"secretRef": {"name": "prod-keys"}}]
    assert not [d for d in rendered["external-secret"] if d["kind"] == "Secret"]
    off = container(rendered["no-policy-no-admin"])
    assert "--policy" not in off["args"] and "--admin-listen" not in off["args"]


def check_inference_pool(pool: dict) -> None:
    """The InferencePool fields of inference.networking.k8s.io/v1 the chart
    writes, as that API defines them (written out here: no registry package
    ships the CRD)."""
    assert pool["apiVersion"] == "inference.networking.k8s.io/v1"
    assert set(pool) == {"apiVersion", "kind", "metadata", "spec"}
    spec = pool["spec"]
    assert set(spec) <= {"selector", "targetPorts", "endpointPickerRef"}
    assert set(spec["selector"]) == {"matchLabels"}
    for key, value in spec["selector"]["matchLabels"].items():
        assert re.fullmatch(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?", value) and len(value) <= 63
    assert len(spec["targetPorts"]) == 1 and set(spec["targetPorts"][0]) == {"number"}
    assert 1 <= spec["targetPorts"][0]["number"] <= 65535
    picker = spec["endpointPickerRef"]
    assert set(picker) <= {"group", "kind", "name", "port", "failureMode"}
    assert 1 <= len(picker["name"]) <= 253
    assert set(picker["port"]) == {"number"} and 1 <= picker["port"]["number"] <= 65535
    assert picker.get("failureMode", "FailClose") in {"FailOpen", "FailClose"}


def check_http_route(route: dict, pool_name: str) -> None:
    """The HTTPRoute fields of gateway.networking.k8s.io/v1 the chart writes."""
    assert route["apiVersion"] == "gateway.networking.k8s.io/v1"
    spec = route["spec"]
    assert set(spec) <= {"parentRefs", "hostnames", "rules"}
    for parent in spec["parentRefs"]:
        assert set(parent) <= {"group", "kind", "name", "namespace", "sectionName", "port"}
        assert parent["kind"] == "Gateway" and parent["name"]
    for rule in spec["rules"]:
        assert set(rule) <= {"matches", "backendRefs", "filters", "timeouts", "name"}
        for match in rule["matches"]:
            assert match["path"]["type"] in {"Exact", "PathPrefix", "RegularExpression"}
            assert match["path"]["value"].startswith("/")
        assert re.fullmatch(r"([0-9]{1,5}(h|m|s|ms)){1,4}", rule["timeouts"]["request"])
        refs = rule["backendRefs"]
        assert refs == [{"group": "inference.networking.k8s.io", "kind": "InferencePool",
                         "name": pool_name}]


def test_the_http_route_validates_against_the_gateway_api_schema(rendered, gateway_models, tmp_path):
    for name in ("pool", "external-secret"):
        route = one(rendered[name], "HTTPRoute")
        assert validate_http_route(gateway_models, route, tmp_path) == "ok", name
    broken = json.loads(json.dumps(one(rendered["pool"], "HTTPRoute")))
    broken["spec"]["rules"][0]["timeouts"]["request"] = "5 minutes"
    assert validate_http_route(gateway_models, broken, tmp_path).startswith("invalid")


def test_the_inference_pool_selects_the_servers_and_the_route_leads_to_it(rendered):
    for name in ("pool", "external-secret"):
        docs = rendered[name]
        pool = one(docs, "InferencePool")
        check_inference_pool(pool)
        deployment = one(docs, "Deployment")
        pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert pool["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
        assert pool["spec"]["targetPorts"][0]["number"] == container(docs)["ports"][0]["containerPort"]
        check_http_route(one(docs, "HTTPRoute"), pool["metadata"]["name"])
    gateways = one(rendered["external-secret"], "HTTPRoute")["spec"]["parentRefs"]
    assert gateways[0]["namespace"] == "gateways"
    assert not [d for d in rendered["defaults"] if d["kind"] in {"InferencePool", "HTTPRoute"}]


def exported_names() -> set[str]:
    """Every metric name the Rust sources spell out."""
    names = set()
    for folder in ("src", "router/src", "policies/src", "engine/src"):
        for path in (ROOT / folder).rglob("*.rs"):
            names |= set(re.findall(r'"(switchyard_[a-z_]+)"', path.read_text()))
    return names


def test_autoscaling_reads_a_metric_the_server_exports(rendered):
    hpa = one(rendered["defaults"], "HorizontalPodAutoscaler")
    metric = hpa["spec"]["metrics"][0]["pods"]["metric"]["name"]
    assert metric in exported_names()
    assert hpa["spec"]["scaleTargetRef"]["name"] == one(rendered["defaults"], "Deployment")["metadata"]["name"]


def test_the_dashboard_queries_only_metrics_the_server_exports():
    dashboard = json.loads(DASHBOARD.read_text())
    exported = exported_names()
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    assert len(exprs) >= 20
    used = set()
    for expr in exprs:
        for name in re.findall(r"\b(switchyard_[a-z_]+)\b", expr):
            base = re.sub(r"_(bucket|sum|count)$", "", name)
            assert base in exported, (base, expr)
            used.add(base)
    # The pool's own series are on it.
    assert {"switchyard_requests_waiting", "switchyard_requests_running",
            "switchyard_kv_cache_usage_ratio", "switchyard_checkpoint_resident"} <= used
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))


def test_the_container_build_file_is_multi_stage_non_root_and_weightless(switchyard_bin):
    text = DOCKERFILE.read_text()
    stages = re.findall(r"^FROM\s+(\S+)(?:\s+AS\s+(\S+))?", text, re.M)
    assert len(stages) >= 2, stages
    final = text.split("\nFROM ")[-1]
    user = re.findall(r"^USER\s+(\S+)", final, re.M)
    assert user and not user[-1].startswith(("0", "root")), user
    assert re.search(r'^VOLUME \["/models"\]', final, re.M)
    copies = re.findall(r"^COPY\s+(.*)$", final, re.M)
    assert copies == ["--from=build /out/switchyard /usr/local/bin/switchyard"], copies
    assert not re.search(r"\.(gguf|safetensors)\b", "\n".join(copies))
    cmd = json.loads(re.search(r"^CMD (\[.*\])$", final, re.M).group(1))
    assert cmd[0] == "serve" and set(a for a in cmd if a.startswith("--")) <= serve_flags(switchyard_bin)
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert {"target", ".venv", "*.gguf", "*.safetensors"} <= set(ignored)
