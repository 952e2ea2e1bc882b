"""Overload against the real binary (issue 17): more clients than the limits get a 429
with Retry-After within milliseconds, the admitted ones finish, and the server's memory
stays under a stated bound, and the admitted requests keep their throughput (tokens per
second of the burst's served requests against one request alone, in the same run).

The server runs with 2 batch slots and a queue of 2 (so 4 requests in flight at most,
2 of them waiting); 48 clients send at once.
"""

from __future__ import annotations

import concurrent.futures
import http.client
import json
import time
from pathlib import Path

import pytest
from serve_process import free_port, running_server

CLIENTS = 48
# The server's RSS may grow at most this much under the burst (KV caches of the 4
# admitted sequences, bodies of the refused ones, allocator slack).
MEMORY_BOUND_BYTES = 64 * 2**20


@pytest.fixture(scope="module")
def server(switchyard_bin: Path, smollm2_path: Path):
    port = free_port()
    args = [str(switchyard_bin), "serve", "--model", str(smollm2_path), "--model-name", "smol",
            "--listen", f"127.0.0.1:{port}", "--max-batch", "2", "--max-queue", "2",
            "--drain-seconds", "5"]
    with running_server(args, port, ready_within=60) as proc:
        yield {"port": port, "proc": proc}


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def one(port: int) -> tuple[int, float, dict, int]:
    """Status, seconds, headers and completion tokens (0 unless 200) of one request."""
    body = json.dumps({"model": "smol", "max_tokens": 48, "temperature": 0,
                       "messages": [{"role": "user", "content": "Count to twenty."}]})
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    started = time.perf_counter()
    try:
        conn.request("POST", "/v1/chat/completions", body=body,
                     headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        payload = response.read()
        elapsed = time.perf_counter() - started
        tokens = json.loads(payload)["usage"]["completion_tokens"] if response.status == 200 else 0
        return response.status, elapsed, dict(response.getheaders()), tokens
    finally:
        conn.close()


# A benchmark (tokens/s beside a solo peer): run alone, by scripts/test.sh --all.
@pytest.mark.slow
def test_more_clients_than_slots_get_429_at_once(server):
    port, pid = server["port"], server["proc"].pid
    one(port)  # warm-up
    # The peer: one request alone, its tokens per second.
    solo = one(port)
    solo_rate = solo[3] / solo[1]
    before = rss_bytes(pid)
    peak = before
    with concurrent.futures.ThreadPoolExecutor(CLIENTS) as pool:
        futures = [pool.submit(one, port) for _ in range(CLIENTS)]
        while not all(f.done() for f in futures):
            peak = max(peak, rss_bytes(pid))
            time.sleep(0.05)
        results = [f.result() for f in futures]
    served_seconds = max(r[1] for r in results if r[0] == 200)
    burst_rate = sum(r[3] for r in results) / served_seconds
    ok = [r for r in results if r[0] == 200]
    refused = [r for r in results if r[0] == 429]
    assert len(ok) + len(refused) == CLIENTS, [r[0] for r in results]
    assert len(ok) >= 1 and len(refused) >= CLIENTS // 2, (len(ok), len(refused))
    assert all(r[2].get("retry-after") == "1" for r in refused)
    refusal_ms = sorted(r[1] * 1e3 for r in refused)
    worst = refusal_ms[-1]
    print(f"overload: {len(ok)} served, {len(refused)} refused with 429; refusal latency "
          f"median {refusal_ms[len(refusal_ms) // 2]:.1f} ms, worst {worst:.1f} ms; RSS "
          f"{before / 2**20:.1f} MiB before, peak {peak / 2**20:.1f} MiB; admitted "
          f"throughput {burst_rate:.1f} tokens/s against {solo_rate:.1f} alone "
          f"({burst_rate / solo_rate:.2f}x)")
    assert worst < 250, refusal_ms
    assert peak - before < MEMORY_BOUND_BYTES
    # The refusals cost the admitted requests little: two batch slots serve about 1.5-1.8x
    # one request alone on an idle machine; the bound leaves room for a shared, noisy one
    # (0.59x was seen with a compile on both cores) and still catches refusals that stall
    # the executor.
    assert burst_rate >= 0.5 * solo_rate, (burst_rate, solo_rate)
