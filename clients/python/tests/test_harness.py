"""The integration tests' own rules: skip without Go or bwrap, but never silently under CI=true."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import test_integration
from sandbox_sidecar import SandboxTerminalError

HERE = Path(__file__).resolve().parent


def run_integration_test_without_go(ci: bool) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", "/tmp")}  # no Go on PATH
    if ci:
        env["CI"] = "true"
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs",
         str(HERE / "test_integration.py"), "-k", "destroy_twice"],
        cwd=HERE.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_missing_go_skips_integration_tests():
    proc = run_integration_test_without_go(ci=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 skipped" in proc.stdout and "Go toolchain" in proc.stdout


def test_missing_go_fails_integration_tests_under_ci():
    proc = run_integration_test_without_go(ci=True)
    assert proc.returncode != 0
    assert "1 error" in proc.stdout and "CI=true" in proc.stdout


def _unknown_op():
    exc = SandboxTerminalError("unknown op attach")
    exc.code = "unknown_op"
    raise exc


def test_an_unknown_op_xfails_outside_ci(monkeypatch):
    monkeypatch.setattr(test_integration, "CI", False)
    with pytest.raises(pytest.xfail.Exception):
        test_integration.require_op(_unknown_op)


def test_an_unknown_op_fails_under_ci(monkeypatch):
    monkeypatch.setattr(test_integration, "CI", True)
    with pytest.raises(pytest.fail.Exception):
        test_integration.require_op(_unknown_op)


def test_other_errors_pass_through_require_op(monkeypatch):
    monkeypatch.setattr(test_integration, "CI", False)

    def gone():
        exc = SandboxTerminalError("gone")
        exc.code = "not_found"
        raise exc

    with pytest.raises(SandboxTerminalError):
        test_integration.require_op(gone)
    assert test_integration.require_op(lambda: 42) == 42
