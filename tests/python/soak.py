"""Soak: mixed traffic over several checkpoints of the demo repository while versions
are activated and rolled back, corrupt versions are loaded, and the routing policy is
reloaded, for a fixed time. Every answer is checked: a greedy completion must be the
text of the checkpoint that says it served it (a request that mixed weights, or was
served by another version than it names, would differ).

    scripts/soak.sh [SECONDS]          (default 600)
    .venv/bin/python tests/python/soak.py --seconds 600 [--bin target/release/switchyard]

Prints, every checkpoint (a tenth of the run): requests, failures, p99 latency of that
window, weight-table swaps, version flips, and the server's RSS; at the end the totals.
Exits non-zero on any failure or mixed answer, or when the server's RSS grows by more
than MEMORY_GROWTH_BOUND between the first checkpoint and the end.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from serve_process import free_port  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "soak-admin-token-0123456789"
PROMPTS = ["The capital of France is", "My favourite food is", "Once upon a time"]
MAX_TOKENS = 6
CHECKPOINTS = ["smollm2@1", "smollm2@2", "smollm2-derived-a@1", "smollm2-derived-b@1"]
SPECS = ["smollm2", "smollm2@1", "smollm2@2", "smollm2-derived-a", "smollm2-derived-b"]
CLIENTS = 8
# RSS may grow this much from the first checkpoint to the end (allocator arenas settle).
MEMORY_GROWTH_BOUND = 0.10

POLICY = """
[routing]
allow_anonymous = true

[[models]]
name = "smollm2"
versions = ["1", "2"]
active_version = "{active}"
cost_per_1k_input = 0.0001
cost_per_1k_output = 0.0002
quality = 0.6
context_limit = 8192

[[models]]
name = "smollm2-derived-a"
version = "1"
cost_per_1k_input = 0.0001
cost_per_1k_output = 0.0002
quality = 0.5
context_limit = 8192

[[models]]
name = "smollm2-derived-b"
version = "1"
cost_per_1k_input = 0.0001
cost_per_1k_output = 0.0002
quality = 0.5
context_limit = 8192
"""


def call(port: int, method: str, path: str, body: bytes | None = None,
         token: str | None = None, timeout: float = 120) -> tuple[int, dict, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        headers = {"Content-Type": "application/json"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        conn.request(method, path, body=body, headers=headers)
        response = conn.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        conn.close()


def greedy(port: int, spec: str, prompt: str) -> tuple[int, str, str]:
    """(status, the checkpoint that served, its text)."""
    body = json.dumps({"model": spec, "prompt": prompt, "max_tokens": MAX_TOKENS,
                       "temperature": 0}).encode()
    status, headers, reply = call(port, "POST", "/v1/completions", body)
    if status != 200:
        return status, "", reply.decode(errors="replace")[:300]
    parsed = json.loads(reply)
    served = parsed["model"]
    if "@" not in served:
        served = f"{served}@{headers.get('x-switchyard-version', '?')}"
    return status, served, parsed["choices"][0]["text"]


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def metric(port: int, name: str) -> float:
    _, _, text = call(port, "GET", "/metrics")
    total = 0.0
    for line in text.decode().splitlines():
        if line.startswith(name) and not line.startswith("#"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def p99(latencies: list[float]) -> float:
    if not latencies:
        return 0.0
    ordered = sorted(latencies)
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


class Soak:
    def __init__(self, port: int, admin_port: int, policy_path: Path):
        self.port, self.admin_port, self.policy_path = port, admin_port, policy_path
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.requests = 0
        self.failures: list[str] = []
        self.window: list[float] = []
        self.flips = 0
        self.corrupt_refused = 0
        self.reloads = 0
        self.reference: dict[tuple[str, str], str] = {}

    def fail(self, message: str):
        with self.lock:
            self.failures.append(message)

    def learn_reference(self):
        for checkpoint in CHECKPOINTS:
            for prompt in PROMPTS:
                status, served, text = greedy(self.port, checkpoint, prompt)
                if status != 200 or served != checkpoint:
                    raise RuntimeError(f"reference for {checkpoint}: {status} {served} {text}")
                self.reference[(checkpoint, prompt)] = text

    def client(self, index: int):
        i = index
        while not self.stop.is_set():
            spec = SPECS[i % len(SPECS)]
            prompt = PROMPTS[(i // len(SPECS)) % len(PROMPTS)]
            i += 1
            started = time.perf_counter()
            try:
                status, served, text = greedy(self.port, spec, prompt)
            except Exception as error:  # noqa: BLE001 -- any failure counts
                self.fail(f"{spec}: {error!r}")
                continue
            elapsed = time.perf_counter() - started
            with self.lock:
                self.requests += 1
                self.window.append(elapsed)
            if status != 200:
                self.fail(f"{spec}: {status} {text}")
            elif (served, prompt) not in self.reference:
                self.fail(f"{spec}: served by unknown checkpoint {served}")
            elif self.reference[(served, prompt)] != text:
                self.fail(f"{spec}: MIXED: {served} gave {text!r}, "
                          f"expected {self.reference[(served, prompt)]!r}")
            elif spec.count("@") and served != spec:
                self.fail(f"{spec}: pinned request served by {served}")

    def admin(self, method: str, path: str, body: bytes | None = None) -> tuple[int, bytes]:
        status, _, reply = call(self.admin_port, method, path, body if body is not None else b"",
                                token=TOKEN)
        return status, reply

    def operator(self):
        step = 0
        while not self.stop.is_set():
            step += 1
            if step % 3 == 0:
                status, reply = self.admin("POST", "/admin/models/smollm2/rollback")
                ok = status in (200, 409)
                self.flips += status == 200
            else:
                version = "2" if step % 2 == 0 else "1"
                status, reply = self.admin(
                    "POST", f"/admin/models/smollm2/versions/{version}/activate")
                ok = status == 200
                self.flips += ok
            if not ok:
                self.fail(f"activate/rollback: {status} {reply[:200]!r}")
            if step % 10 == 0:
                status, reply = self.admin("POST", "/admin/models/smollm2/versions/3/load")
                if 400 <= status < 500:
                    self.corrupt_refused += 1
                else:
                    self.fail(f"corrupt load answered {status}: {reply[:200]!r}")
            if step % 5 == 0:
                active = "2" if (step // 5) % 2 else "1"
                self.policy_path.write_text(POLICY.format(active=active))
                status, reply = self.admin("POST", "/admin/policy/reload")
                if status == 200:
                    self.reloads += 1
                    self.flips += 1
                else:
                    self.fail(f"policy reload: {status} {reply[:200]!r}")
            time.sleep(0.05)


def run(binary: Path, base_model: Path, seconds: float, out=sys.stdout) -> dict:
    work = Path(tempfile.mkdtemp(prefix="switchyard-soak-"))
    try:
        repo = work / "repo"
        subprocess.run([str(binary), "demo-repo", str(repo), "--base", str(base_model)],
                       check=True, capture_output=True)
        # A corrupt version, refused at startup (served around with --allow-partial-start)
        # and at every admin load.
        corrupt = repo / "smollm2" / "3"
        corrupt.mkdir()
        source = next((repo / "smollm2" / "1").glob("*.gguf"))
        data = source.read_bytes()
        (corrupt / "model.gguf").write_bytes(data[: len(data) // 3])
        policy_path = work / "policy.toml"
        policy_path.write_text(POLICY.format(active="1"))
        port, admin_port = free_port(), free_port()
        args = [str(binary), "serve", "--repo", str(repo), "--policy", str(policy_path),
                "--listen", f"127.0.0.1:{port}", "--admin-listen", f"127.0.0.1:{admin_port}",
                "--admin-token", TOKEN, "--drain-seconds", "5", "--max-batch", "16",
                "--allow-partial-start"]
        log = open(work / "server.log", "w")
        proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=log)
        try:
            return drive(proc, port, admin_port, policy_path, seconds, out)
        finally:
            proc.terminate()
            proc.wait(timeout=30)
            log.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)


def drive(proc, port: int, admin_port: int, policy_path: Path, seconds: float, out) -> dict:
    deadline = time.time() + 180
    while True:
        if proc.poll() is not None:
            raise RuntimeError("the server exited during startup")
        try:
            if call(port, "GET", "/ready", timeout=2)[0] == 200:
                break
        except OSError:
            pass
        if time.time() > deadline:
            raise RuntimeError("the server did not become ready")
        time.sleep(0.2)
    soak = Soak(port, admin_port, policy_path)
    soak.learn_reference()
    workers = [threading.Thread(target=soak.client, args=(i,), daemon=True)
               for i in range(CLIENTS)]
    operator = threading.Thread(target=soak.operator, daemon=True)
    swaps_start = metric(port, "switchyard_swaps_total")
    for thread in workers + [operator]:
        thread.start()
    checkpoints = []
    started = time.time()
    interval = max(seconds / 10, 1.0)
    rss_first = None
    while time.time() - started < seconds:
        time.sleep(min(interval, max(0.0, seconds - (time.time() - started))))
        with soak.lock:
            window, soak.window = soak.window, []
            requests, failures = soak.requests, len(soak.failures)
        rss = rss_bytes(proc.pid)
        rss_first = rss_first or rss
        swaps = metric(port, "switchyard_swaps_total") - swaps_start
        point = {"t": round(time.time() - started, 1), "requests": requests,
                 "failures": failures, "p99_ms": round(p99(window) * 1e3, 1),
                 "swaps": int(swaps), "flips": soak.flips, "rss_mib": round(rss / 2**20, 1)}
        checkpoints.append(point)
        print(json.dumps(point), file=out, flush=True)
    soak.stop.set()
    for thread in workers + [operator]:
        thread.join(timeout=180)
    rss_end = rss_bytes(proc.pid)
    summary = {
        "seconds": seconds, "requests": soak.requests, "failures": len(soak.failures),
        "first_failures": soak.failures[:5],
        "swaps": int(metric(port, "switchyard_swaps_total") - swaps_start),
        "version_flips": soak.flips, "policy_reloads": soak.reloads,
        "corrupt_loads_refused": soak.corrupt_refused,
        "p99_ms_by_checkpoint": [c["p99_ms"] for c in checkpoints],
        "rss_mib_first": round((rss_first or rss_end) / 2**20, 1),
        "rss_mib_end": round(rss_end / 2**20, 1),
        "memory_growth_bound": MEMORY_GROWTH_BOUND,
    }
    summary["memory_within_bound"] = rss_end <= (rss_first or rss_end) * (1 + MEMORY_GROWTH_BOUND)
    print(json.dumps(summary), file=out, flush=True)
    return summary


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=600)
    parser.add_argument("--bin", type=Path,
                        default=Path(os.environ.get("SWITCHYARD_BIN",
                                                    ROOT / "target" / "release" / "switchyard")))
    parser.add_argument("--model", type=Path, default=None)
    args = parser.parse_args()
    model = args.model or Path(subprocess.run(
        [str(ROOT / "scripts" / "fetch-model.sh")], check=True, capture_output=True,
        text=True).stdout.strip().splitlines()[-1])
    summary = run(args.bin, model, args.seconds)
    ok = summary["failures"] == 0 and summary["memory_within_bound"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
