"""Every shell (and Python) example in README.md, run as written against the binary.

The fenced ```sh blocks are read from README.md in order; each command runs with
three substitutions a test needs: `switchyard` and `cargo run --release --` are the
binary under test, the server listens on a free port instead of 8080 (each README
address rewritten to it), and /tmp/repo is a temporary folder. A `serve` command
starts a server in the background (stopping the one before, as a user's Ctrl-C
would) and waits for /ready; the commands after it run against it. Commands that
cannot run inside a test are listed in SKIPPED with the reason; a README command
that is neither run nor listed fails the test, so new examples are not forgotten.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from first_hour_server import logged_server
from serve_process import free_port

README = Path(__file__).resolve().parents[2] / "README.md"

# Command prefix -> why it is not run here.
SKIPPED = {
    "scripts/setup.sh && scripts/test.sh": "the project's test command itself: running it "
    "from one of its tests would recurse (CI runs it)",
}


def fenced_blocks(text: str) -> list[tuple[str, str]]:
    """(language, body) of every fenced block."""
    return re.findall(r"^```(\w*)\n(.*?)^```", text, flags=re.S | re.M)


def commands(block: str) -> list[str]:
    """A shell block's commands: continuations and quoted newlines joined, comments
    and blank lines left out."""
    out, pending = [], ""
    for line in re.sub(r"\\\n\s*", " ", block).splitlines():
        if not pending and (not line.strip() or line.strip().startswith("#")):
            continue
        pending = f"{pending}\n{line}" if pending else line.strip()
        try:
            shlex.split(pending)
        except ValueError:  # a quote still open: the command goes on
            continue
        out.append(pending)
        pending = ""
    assert not pending, f"unterminated command in README: {pending}"
    return out


class Session:
    """The README's commands, one after another, with the substitutions above."""

    def __init__(self, binary: Path, tmp: Path):
        self.binary, self.tmp, self.port = binary, tmp, free_port()
        self.server = None
        self.ran: list[str] = []
        self.skipped: list[str] = []
        bin_dir = tmp / "bin"
        bin_dir.mkdir()
        (bin_dir / "switchyard").symlink_to(binary)
        self.env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}

    def substitute(self, command: str) -> str:
        command = command.replace("cargo run --release --", "switchyard")
        command = re.sub(r"(localhost|127\.0\.0\.1):8080", f"127.0.0.1:{self.port}", command)
        return command.replace("/tmp/repo", str(self.tmp / "repo"))

    def run(self, command: str):
        reason = next((why for prefix, why in SKIPPED.items() if command.startswith(prefix)), None)
        if reason:
            self.skipped.append(command)
            return
        shell = self.substitute(command)
        words = shlex.split(shell)
        program = next(w for w in words if "=" not in w.split("/")[0])
        if program == "switchyard" and "serve" in words:
            self.serve(words)
        else:
            done = subprocess.run(["bash", "-c", shell], env=self.env, capture_output=True, text=True, timeout=300)
            assert done.returncode == 0, f"README command failed: {command}\n{done.stdout}\n{done.stderr}"
            if program == "curl" and "/v1/embeddings" in shell:
                assert '"object":"embedding"' in done.stdout, f"{command}\n{done.stdout[:500]}"
            elif program == "curl" and "/v1/" in shell:
                assert '"choices"' in done.stdout, f"{command}\n{done.stdout}"
        self.ran.append(command)

    def serve(self, words: list[str]):
        self.stop()
        # Leading NAME=value words are the command's environment.
        start = next(i for i, w in enumerate(words) if "=" not in w)
        env = dict(w.split("=", 1) for w in words[:start])
        argv = [str(self.binary), *words[start + 1:], "--listen", f"127.0.0.1:{self.port}", "--drain-seconds", "2"]
        log = self.tmp / f"serve-{len(self.ran)}.log"
        self.server = logged_server(argv, self.port, log, env=env)
        self.server.__enter__()

    def stop(self):
        if self.server is not None:
            self.server.__exit__(None, None, None)
            self.server = None


@pytest.fixture(scope="module")
def readme_session(switchyard_bin, tmp_path_factory):
    session = Session(switchyard_bin, tmp_path_factory.mktemp("readme"))
    yield session
    session.stop()


def test_every_readme_shell_example_runs(readme_session):
    blocks = fenced_blocks(README.read_text())
    shell = [body for lang, body in blocks if lang in ("sh", "bash", "shell")]
    assert len(shell) >= 3, "README.md has fewer shell examples than expected"
    for body in shell:
        for command in commands(body):
            readme_session.run(command)
        if "curl" in body:
            # The Python client example runs against the same server as the curl one.
            for lang, python in blocks:
                if lang == "python":
                    code = python.replace("127.0.0.1:8080", f"127.0.0.1:{readme_session.port}")
                    done = subprocess.run([sys.executable, "-c", code],
                                          capture_output=True, text=True, timeout=300)
                    assert done.returncode == 0 and done.stdout.strip(), done.stderr
    assert sorted(readme_session.skipped) == sorted(SKIPPED), readme_session.skipped
    assert any(c.startswith("curl") for c in readme_session.ran), readme_session.ran
    assert any("serve" in c for c in readme_session.ran), readme_session.ran
