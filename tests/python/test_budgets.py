"""Budgets that hold, end to end through real `switchyard serve` processes on SmolLM2.

- One instance, many clients at once against one tenant budget: the total billed never
  passes the limit (reservations hold the prompt's real, templated token count plus
  `max_tokens` before anything runs).
- The embedded ledger (the default) under `kill -9` at random moments: after each
  restart the settled spend covers every `usage` a client received, no reservation is
  left held, and a spent budget still refuses. SWITCHYARD_CRASH_KILLS sets how many
  kills (default 5; the long variant uses 50 or more).
- Three instances sharing one Redis (`--ledger redis://...`): zero overspend with
  clients spread over them and one instance killed and restarted mid-run.
- Redis stopped and restarted mid-run: budgeted requests get 503 with Retry-After
  (fail closed), requests without a budget are still served, and everything works
  again once Redis is back, without restarting switchyard; no settled spend is lost.

Redis comes from Debian's `redis-server` package (scripts/setup.sh installs it); the
tests start their own on a loopback port. See conftest.py for SWITCHYARD_BIN and
SWITCHYARD_MODEL.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from serve_process import free_port

KEY = "sk-budget-tenant"
FREE_KEY = "sk-free-tenant"
ADMIN_TOKEN = "admin-budget-token-0123"
MAX_TOKENS = 24
LIMIT = 600
PROMPT = "Name one colour."


def sha(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def policy_text(limit: int) -> str:
    return f"""\
[routing]
allow_anonymous = false

[[models]]
name = "smol"
version = "v1"
cost_per_1k_input = 0.001
cost_per_1k_output = 0.002
quality = 0.5
context_limit = 8192

[[tenants]]
name = "budgeted"
api_keys = ["sha256:{sha(KEY)}"]

[[tenants.budgets]]
window = "1d"
limit_tokens = {limit}

[[tenants]]
name = "free"
api_keys = ["sha256:{sha(FREE_KEY)}"]
"""


class Server:
    """One `switchyard serve` process that can be killed and started again."""

    def __init__(self, binary: Path, settings: Path, policy: Path, extra: list[str], log: Path):
        self.port, self.admin_port = free_port(), free_port()
        self.args = [str(binary), "serve", "--config", str(settings), "--policy", str(policy),
                     "--listen", f"127.0.0.1:{self.port}",
                     "--admin-listen", f"127.0.0.1:{self.admin_port}",
                     "--drain-seconds", "2", *extra]
        self.log = log
        self.proc: subprocess.Popen | None = None

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, ready_within: float = 120) -> None:
        with open(self.log, "a") as log:
            self.proc = subprocess.Popen(
                self.args, stdout=subprocess.DEVNULL, stderr=log,
                env={**os.environ, "SWITCHYARD_ADMIN_TOKEN": ADMIN_TOKEN})
        deadline = time.time() + ready_within
        while time.time() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(f"switchyard serve exited early:\n{self.log.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(f"{self.base}/ready", timeout=1) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, OSError):
                pass
            time.sleep(0.1)
        self.proc.kill()
        pytest.fail("switchyard serve did not become ready")

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()

    def admin(self, path: str):
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.admin_port}{path}",
            headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
        with urllib.request.urlopen(request, timeout=30) as r:
            return r.read().decode()

    def budget(self) -> dict:
        policy = json.loads(self.admin("/admin/policy"))
        return next(t for t in policy["tenants"] if t["name"] == "budgeted")["budgets"][0]


def chat(base: str, key: str, timeout: float = 120):
    """(status, body, headers) of one chat completion."""
    body = json.dumps({"model": "smol", "max_tokens": MAX_TOKENS, "temperature": 0,
                       "messages": [{"role": "user", "content": PROMPT}]}).encode()
    request = urllib.request.Request(f"{base}/v1/chat/completions", data=body, method="POST",
                                     headers={"Authorization": f"Bearer {key}",
                                              "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as r:
            return r.status, json.loads(r.read()), {k.lower(): v for k, v in r.headers.items()}
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}"), {k.lower(): v for k, v in e.headers.items()}


@pytest.fixture(scope="module")
def setup(switchyard_bin: Path, smollm2_path: Path, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("budgets")
    settings = tmp / "serve.toml"
    settings.write_text(
        "threads = 2\nmax_batch = 8\n"
        f'[[models]]\npath = "{smollm2_path}"\nname = "smol"\nversion = "v1"\n')
    return {"bin": switchyard_bin, "settings": settings, "tmp": tmp}


def new_server(setup, name: str, limit: int, extra: list[str]) -> Server:
    policy = setup["tmp"] / f"{name}.toml"
    policy.write_text(policy_text(limit))
    return Server(setup["bin"], setup["settings"], policy, extra, setup["tmp"] / f"{name}.log")


def drain_budget(bases: list[str], clients: int, tally: dict, lock: threading.Lock,
                 stop: threading.Event | None = None) -> None:
    """`clients` threads, spread over `bases`, each asking until refused with 429."""
    def worker(i: int):
        base = bases[i % len(bases)]
        while stop is None or not stop.is_set():
            try:
                status, body, headers = chat(base, KEY)
            except (urllib.error.URLError, ConnectionError, OSError):
                # The instance was killed under us: the request never answered.
                with lock:
                    tally["lost"] += 1
                base = bases[(bases.index(base) + 1) % len(bases)]
                time.sleep(0.2)
                continue
            with lock:
                tally["statuses"].append(status)
                if status == 200:
                    tally["billed"] += body["usage"]["total_tokens"]
                    tally["served"] += 1
            if status == 429:
                return
            assert status == 200, (status, body)

    with concurrent.futures.ThreadPoolExecutor(clients) as pool:
        for future in [pool.submit(worker, i) for i in range(clients)]:
            future.result()


def test_concurrent_clients_never_overspend_one_budget(setup):
    server = new_server(setup, "concurrent", LIMIT, ["--state-dir", str(setup["tmp"] / "c")])
    server.start()
    try:
        tally = {"billed": 0, "served": 0, "lost": 0, "statuses": []}
        drain_budget([server.base], 12, tally, threading.Lock())
        print(f"\n12 clients, one {LIMIT}-token budget: {tally['served']} served, "
              f"{tally['billed']} tokens billed")
        assert tally["served"] >= 1
        assert tally["billed"] <= LIMIT, tally
        budget = server.budget()
        assert budget["settled"] == tally["billed"], (budget, tally)
        assert budget["reserved"] == 0
        # The refusal names the budget; the usage ledger lists every billed request.
        status, body, _ = chat(server.base, KEY)
        assert status == 429 and body["error"]["code"] == "budget_exhausted", body
        lines = server.admin("/admin/usage?since=0").splitlines()
        records = [json.loads(line) for line in lines]
        assert len(records) == tally["served"]
        assert sum(r["tokens_in"] + r["tokens_out"] for r in records) == tally["billed"]
        assert {r["tenant"] for r in records} == {"budgeted"}
        assert all(r["model"] == "smol" and r["version"] == "v1" and r["request_id"]
                   and r["key_id"] == sha(KEY)[:12] for r in records)
        csv = server.admin("/admin/usage?format=csv&since=0").splitlines()
        assert csv[0].startswith("time_ms,tenant,key_id,model,version,tokens_in")
        assert len(csv) == len(records) + 1
        # A tenant without a budget is served and recorded too.
        status, _, _ = chat(server.base, FREE_KEY)
        assert status == 200
        later = server.admin(f"/admin/usage?since={records[-1]['time_ms'] / 1000}")
        assert any(json.loads(line)["tenant"] == "free" for line in later.splitlines())
    finally:
        server.stop()


def crash_kills() -> int:
    return int(os.environ.get("SWITCHYARD_CRASH_KILLS", "5"))


# A crash soak (five kill -9 and restarts under load): in the slow set.
@pytest.mark.slow
def test_kill_9_loses_no_settled_spend_and_leaves_no_reservation(setup):
    """Clients keep asking while the server is killed at random moments and restarted
    on the same state directory. The ledger may hold more than the clients saw (a
    request settled just before the kill whose answer never left), never less."""
    state = setup["tmp"] / "crash-state"
    server = new_server(setup, "crash", 10_000_000, ["--state-dir", str(state)])
    server.start()
    lock = threading.Lock()
    tally = {"billed": 0, "served": 0, "lost": 0, "statuses": []}
    stop = threading.Event()
    rng = random.Random(38)
    worst = 0
    try:
        clients = threading.Thread(
            target=drain_budget, args=([server.base], 4, tally, lock, stop), daemon=True)
        clients.start()
        for _ in range(crash_kills()):
            time.sleep(rng.uniform(0.2, 1.5))
            server.kill9()
            server.start()
        stop.set()
        clients.join(timeout=300)
        budget = server.budget()
        with lock:
            billed, lost, served = tally["billed"], tally["lost"], tally["served"]
        # Every lost request could have spent at most its prompt plus max_tokens.
        worst = billed // max(served, 1) + MAX_TOKENS
        print(f"\n{crash_kills()} kills: {served} answered ({billed} tokens), {lost} lost to "
              f"a kill, ledger settled {budget['settled']:.0f}, reserved {budget['reserved']:.0f}")
        assert budget["reserved"] == 0, budget
        assert billed <= budget["settled"] <= billed + lost * worst, (budget, tally)
        records = [json.loads(line) for line in server.admin("/admin/usage").splitlines()]
        assert sum(r["tokens_in"] + r["tokens_out"] for r in records) == budget["settled"]
    finally:
        stop.set()
        server.stop()


def test_a_spent_budget_still_refuses_after_kill_9(setup):
    state = setup["tmp"] / "spent-state"
    server = new_server(setup, "spent", 200, ["--state-dir", str(state)])
    server.start()
    try:
        tally = {"billed": 0, "served": 0, "lost": 0, "statuses": []}
        drain_budget([server.base], 1, tally, threading.Lock())
        server.kill9()
        server.start()
        status, body, _ = chat(server.base, KEY)
        assert status == 429, body
        assert server.budget()["settled"] == tally["billed"]
    finally:
        server.stop()


@pytest.fixture
def redis(tmp_path):
    """A Redis server on a loopback port, appending every write to disk (fsync always)
    so that a restart keeps what was settled."""
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.fail("redis-server is not installed: run scripts/setup.sh (Debian redis-server)")
    port = free_port()
    args = [binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(tmp_path),
            "--save", "", "--appendonly", "yes", "--appendfsync", "always"]
    state = {"port": port, "proc": None}

    def start():
        state["proc"] = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + 60  # a guard against a hang: it starts in milliseconds
        while time.time() < deadline:
            if subprocess.run(["redis-cli", "-p", str(port), "ping"], capture_output=True,
                              text=True).stdout.strip() == "PONG":
                return
            time.sleep(0.05)
        pytest.fail("redis-server did not start")

    def stop():
        proc = state["proc"]
        if proc is not None and proc.poll() is None:
            proc.terminate()
            proc.wait(timeout=10)

    state["start"], state["stop"] = start, stop
    start()
    yield state
    stop()


def test_three_instances_sharing_redis_never_overspend(setup, redis):
    url = f"redis://127.0.0.1:{redis['port']}/0"
    # A budget of some 50 requests, so that the kill lands mid-run.
    limit = 2000
    servers = [new_server(setup, f"cluster{i}", limit, ["--ledger", url]) for i in range(3)]
    for server in servers:
        server.start()
    try:
        lock = threading.Lock()
        tally = {"billed": 0, "served": 0, "lost": 0, "statuses": []}
        runner = threading.Thread(
            target=drain_budget, args=([s.base for s in servers], 12, tally, lock), daemon=True)
        runner.start()
        time.sleep(0.5)
        servers[1].kill9()
        servers[1].start()
        runner.join(timeout=600)
        assert not runner.is_alive()
        print(f"\n3 instances, one Redis, one {limit}-token budget: {tally['served']} served, "
              f"{tally['billed']} tokens billed, {tally['lost']} lost to the kill")
        assert set(tally["statuses"]) <= {200, 429}, tally
        assert tally["billed"] <= limit, tally
        # Every instance reads the same window; a killed instance's holds expire, its
        # settled spend stays.
        settled = {s.budget()["settled"] for s in servers}
        assert len(settled) == 1
        assert tally["billed"] <= settled.pop() <= limit
        for server in servers:
            status, _, _ = chat(server.base, KEY)
            assert status == 429
    finally:
        for server in servers:
            server.stop()


def test_redis_outage_fails_closed_and_recovers_without_restart(setup, redis):
    url = f"redis://127.0.0.1:{redis['port']}"
    server = new_server(setup, "outage", 1_000_000, ["--ledger", url])
    server.start()
    try:
        assert chat(server.base, KEY)[0] == 200
        before = server.budget()["settled"]
        assert before > 0
        redis["stop"]()
        status, body, headers = chat(server.base, KEY, timeout=30)
        assert status == 503, body
        assert body["error"]["code"] == "budget_unavailable"
        assert int(headers.get("retry-after", "0")) >= 1
        # A tenant without a budget needs no ledger to be served.
        assert chat(server.base, FREE_KEY, timeout=30)[0] == 200
        metrics = server.admin("/admin/metrics")
        assert "switchyard_ledger_up 0" in metrics
        redis["start"]()
        deadline = time.time() + 120  # it retries every 0.5 s; a guard against a hang
        while chat(server.base, KEY)[0] != 200:
            assert time.time() < deadline, "switchyard never reconnected to Redis"
            time.sleep(0.5)
        after = server.budget()["settled"]
        assert after > before, (before, after)
        log = server.log.read_text()
        assert "Redis is unreachable" in log and "Redis is reachable again" in log
    finally:
        server.stop()
