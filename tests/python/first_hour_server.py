"""A `switchyard serve` whose console (stderr) is kept in a file, so tests can
read what it said at startup; and a runner for commands expected to fail."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest


@contextlib.contextmanager
def logged_server(args: list[str], port: int, log: Path, ready_within: float = 120, env: dict | None = None):
    """Runs `args` listening on `port` with stderr in `log` (and `env` added to the
    environment), waits for /ready, yields the process, then stops it with SIGTERM."""
    with log.open("w") as err, tempfile.TemporaryDirectory(prefix="switchyard-state-") as state:
        proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=err, text=True,
                                env={**own_state(state), **(env or {})})
        base = f"http://127.0.0.1:{port}"
        deadline = time.time() + ready_within
        try:
            while True:
                if proc.poll() is not None:
                    pytest.fail(f"switchyard serve exited early: {log.read_text()}")
                try:
                    with urllib.request.urlopen(f"{base}/ready", timeout=1) as r:
                        if r.status == 200:
                            break
                except (urllib.error.URLError, ConnectionError, OSError):
                    pass
                if time.time() > deadline:
                    pytest.fail(f"switchyard serve was not ready within {ready_within:.0f} s: {log.read_text()}")
                time.sleep(0.2)
            yield proc
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()


def run_to_exit(args: list[str], timeout: float = 120) -> subprocess.CompletedProcess:
    """Runs a command that should exit by itself (a refused startup, say)."""
    with tempfile.TemporaryDirectory(prefix="switchyard-state-") as state:
        return subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=timeout,
                              env=own_state(state))


def own_state(state: str) -> dict:
    """The environment with a state directory (spend ledger) of the command's own: two
    servers on one default ledger refuse to start, and tests run beside other servers."""
    return {"SWITCHYARD_STATE_DIR": state, **os.environ}
