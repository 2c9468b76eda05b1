"""The checks every case of the hardening battery makes: the command refused (or stopped) with one line and the
expected exit status, no traceback, nothing changed in the folder it was given, and the canary secret appears in
no file written and no line printed."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import forked_python

ROOT = Path(__file__).resolve().parents[1]
# A made-up key: any file or output line holding it is a leak.
CANARY = "sk-canary-4f1e9b7d2c8a6e3f"


def snapshot(root) -> dict[str, str]:
    """Relative path -> sha256 of every file below `root` (folders alone are not recorded)."""
    root = Path(root)
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def assert_unchanged(before: dict[str, str], root) -> None:
    after = snapshot(root)
    assert after == before, f"files changed: {sorted(set(after.items()) ^ set(before.items()))}"


def assert_no_canary(root, *texts, canary: str = CANARY) -> None:
    """Neither a file below `root` nor any of `texts` (printed output) holds the canary."""
    for text in texts:
        assert canary not in (text or ""), f"the canary was printed: {text!r}"
    for p in Path(root).rglob("*"):
        if p.is_file():
            assert canary.encode() not in p.read_bytes(), f"the canary was written to {p}"


def assert_one_line(proc: subprocess.CompletedProcess, *needles: str, status: int = 2) -> str:
    """The command exited with `status`, printed no traceback, and its stderr is one line holding `needles`."""
    err = proc.stderr.strip()
    assert proc.returncode == status, f"exit {proc.returncode}, expected {status}; stderr: {err}"
    assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, f"expected one line on stderr, got {len(lines)}: {err}"
    for needle in needles:
        assert needle in lines[0], f"{needle!r} not in {lines[0]!r}"
    return lines[0]


def run_module(module: str, *args, cwd, env: dict | None = None, timeout: float = 300,
               input: str | None = None) -> subprocess.CompletedProcess:
    """`python -m module args...` in `cwd`, this checkout first on the path, the canary in OPENAI_API_KEY."""
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), "OPENAI_API_KEY": CANARY, **(env or {})}
    return forked_python.run([sys.executable, "-m", module, *map(str, args)], cwd=cwd, env=full_env,
                          capture_output=True, text=True, timeout=timeout, input=input)
