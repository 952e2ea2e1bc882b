"""Starting and stopping a real `switchyard serve` for black-box tests."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request

import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def running_server(args: list[str], port: int, env: dict | None = None, ready_within: float = 120):
    """Runs `args` (a `switchyard serve` command line listening on `port`),
    waits for `GET /ready`, yields the process, then stops it with SIGTERM and
    checks that it drained and exited cleanly.

    Unless the command names its own `--state-dir` (or the environment does), the
    server keeps its spend ledger in a fresh directory, removed afterwards: no test
    inherits another's spent budgets, and servers running side by side do not share
    one ledger file."""
    env = {**os.environ, **(env or {})}
    state_dir = None
    if "--state-dir" not in args and "SWITCHYARD_STATE_DIR" not in env:
        state_dir = tempfile.mkdtemp(prefix="switchyard-state-")
        env["SWITCHYARD_STATE_DIR"] = state_dir
    try:
        yield from _run(args, port, env, ready_within)
    finally:
        if state_dir is not None:
            shutil.rmtree(state_dir, ignore_errors=True)


def _run(args: list[str], port: int, env: dict, ready_within: float):
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env=env)
    base = f"http://127.0.0.1:{port}"
    deadline = time.time() + ready_within
    while True:
        if proc.poll() is not None:
            pytest.fail(f"switchyard serve exited early: {proc.stderr.read()}")
        try:
            with urllib.request.urlopen(f"{base}/ready", timeout=1) as r:
                if r.status == 200:
                    break
        except (urllib.error.URLError, ConnectionError, OSError):
            pass
        if time.time() > deadline:
            proc.kill()
            pytest.fail(f"switchyard serve did not become ready within {ready_within:.0f} s")
        time.sleep(0.2)
    yield proc
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail("switchyard serve did not stop within 15 s of SIGTERM")
    assert proc.returncode == 0, proc.stderr.read()
