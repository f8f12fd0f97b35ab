"""The stand-in contract (used when the Airflow provider is not installed), against a real shell.

Restates, in this project's words, what upstream's own contract tests
(apache/airflow ``providers/common/ai/tests/unit/common/ai/sandbox/test_base.py``
at 01f824e6) hold its base class to: the concrete shell file operations and
export, the network stamp, ``dag_run_owner`` and ``is_sandbox_handle``.
"""

from __future__ import annotations

import io
import os
import subprocess
from types import SimpleNamespace

import pytest

from sandbox_sidecar import contract
from sandbox_sidecar.contract import (
    SandboxBackend,
    SandboxError,
    SandboxExecResult,
    SandboxFileTooLargeError,
    SandboxSpec,
    SandboxTerminalError,
)

pytestmark = pytest.mark.skipif(contract.UPSTREAM, reason="the provider is installed: its own tests cover its classes")


class ShellBackend(SandboxBackend):
    """Only the three required methods, so every file operation is the inherited recipe."""

    name = "shell"

    def __init__(self, root):
        self.root = root

    def create(self, *, spec=None):
        return "local"

    def run_command(self, sandbox, command, *, timeout, max_output_bytes):
        proc = subprocess.run(["sh", "-c", command], capture_output=True, cwd=self.root, timeout=timeout)
        return SandboxExecResult(
            exit_code=proc.returncode,
            stdout=proc.stdout[:max_output_bytes].decode(errors="replace"),
            stderr=proc.stderr[:max_output_bytes].decode(errors="replace"),
            stdout_truncated=len(proc.stdout) > max_output_bytes,
        )

    def destroy(self, sandbox):
        pass


@pytest.fixture
def shell(tmp_path):
    return ShellBackend(str(tmp_path))


def test_only_lifecycle_and_commands_are_abstract():
    abstract = {n for n in dir(SandboxBackend) if getattr(getattr(SandboxBackend, n), "__isabstractmethod__", False)}
    assert abstract == {"create", "run_command", "destroy"}


def test_files_round_trip_through_the_shell_recipes(shell, tmp_path):
    blob = bytes(range(256)) * 3
    shell.write_file("s", str(tmp_path / "deep" / "er" / "b.bin"), blob)
    assert shell.read_file("s", str(tmp_path / "deep" / "er" / "b.bin"), max_bytes=len(blob)) == blob
    for name in ["with space", "it's", 'dq"', "semi;colon", "$HOME", "new\nline"]:
        shell.write_file("s", str(tmp_path / name), b"payload")
        assert shell.read_file("s", str(tmp_path / name), max_bytes=7) == b"payload"
    (tmp_path / "sub").mkdir()
    listing = dict(shell.list_directory("s", str(tmp_path)))
    assert listing["sub"] is True and listing["deep"] is True and listing["new\nline"] is False


def test_read_refusals(shell, tmp_path):
    with pytest.raises(SandboxError, match="does not exist"):
        shell.read_file("s", str(tmp_path / "nope"), max_bytes=10)
    (tmp_path / "d").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "d")
    for p in ("d", "link"):
        with pytest.raises(SandboxError, match="is a directory"):
            shell.read_file("s", str(tmp_path / p), max_bytes=10)
    (tmp_path / "big").write_bytes(b"x" * 500)
    with pytest.raises(SandboxFileTooLargeError) as info:
        shell.read_file("s", str(tmp_path / "big"), max_bytes=100)
    assert (info.value.size_bytes, info.value.max_bytes) == (500, 100)
    # stat says 0 for /dev/zero: only the cap inside the guest stops it
    with pytest.raises(SandboxFileTooLargeError):
        shell.read_file("s", "/dev/zero", max_bytes=1024)
    with pytest.raises(SandboxError):
        shell.list_directory("s", str(tmp_path / "nope"))


@pytest.fixture
def small_slices(monkeypatch):
    monkeypatch.setattr(contract, "EXPORT_SLICE_BYTES", 64)


@pytest.mark.parametrize("size", [0, 1, 63, 64, 65, 1000])
def test_export_copies_across_slices(shell, tmp_path, small_slices, size):
    blob = os.urandom(size)
    (tmp_path / "f").write_bytes(blob)
    dest = io.BytesIO()
    assert shell.export_file("s", str(tmp_path / "f"), dest, max_bytes=10_000) == size
    assert dest.getvalue() == blob


def test_export_refusals(shell, tmp_path, small_slices):
    with pytest.raises(SandboxError, match="does not exist"):
        shell.export_file("s", str(tmp_path / "nope"), io.BytesIO(), max_bytes=100)
    (tmp_path / "d").mkdir()
    with pytest.raises(SandboxError, match="is a directory"):
        shell.export_file("s", str(tmp_path / "d"), io.BytesIO(), max_bytes=100)
    with pytest.raises(SandboxError, match="not a regular file"):
        shell.export_file("s", "/dev/zero", io.BytesIO(), max_bytes=100)
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(SandboxError, match="not a regular file"):
        shell.export_file("s", str(tmp_path / "fifo"), io.BytesIO(), max_bytes=100)
    (tmp_path / "big").write_bytes(b"x" * 500)
    dest = io.BytesIO()
    with pytest.raises(SandboxFileTooLargeError) as info:
        shell.export_file("s", str(tmp_path / "big"), dest, max_bytes=100)
    assert info.value.size_bytes == 500 and dest.getvalue() == b"", "refused before anything is written"


def grow_after_probe(shell, target, extra):
    run = shell.run_command

    def growing(sandbox, command, **kw):
        result = run(sandbox, command, **kw)
        if "stat" in command and not growing.done:
            growing.done = True
            with open(target, "ab") as f:
                f.write(b"y" * extra)
        return result

    growing.done = False
    shell.run_command = growing


def test_a_file_that_changes_during_the_export_is_an_error(shell, tmp_path, small_slices):
    target = tmp_path / "f"
    target.write_bytes(b"x" * 100)
    grow_after_probe(shell, target, 10)
    with pytest.raises(SandboxError, match="changed while it was exported"):
        shell.export_file("s", str(target), io.BytesIO(), max_bytes=1000)


def test_a_file_that_grows_past_the_budget_is_too_large(shell, tmp_path, small_slices):
    target = tmp_path / "f"
    target.write_bytes(b"x" * 100)
    grow_after_probe(shell, target, 500)
    with pytest.raises(SandboxFileTooLargeError):
        shell.export_file("s", str(target), io.BytesIO(), max_bytes=200)


def test_the_export_deadline(shell, tmp_path, small_slices, monkeypatch):
    assert contract.export_deadline(1 << 30) == 1024
    assert contract.export_deadline(1024) == contract.FILE_OP_TIMEOUT
    (tmp_path / "f").write_bytes(b"x" * 1000)
    monkeypatch.setattr(contract, "export_deadline", lambda max_bytes: 0.0)
    with pytest.raises(SandboxError, match="took longer than"):
        shell.export_file("s", str(tmp_path / "f"), io.BytesIO(), max_bytes=10_000)


def test_a_sandbox_that_ends_mid_export_is_terminal(shell, tmp_path, small_slices):
    (tmp_path / "f").write_bytes(b"x" * 100)
    run = shell.run_command

    def ending(sandbox, command, **kw):
        if "dd " in command:
            return SandboxExecResult(exit_code=-1, stdout="", stderr="", sandbox_terminated=True)
        return run(sandbox, command, **kw)

    shell.run_command = ending
    with pytest.raises(SandboxTerminalError, match="ended"):
        shell.export_file("s", str(tmp_path / "f"), io.BytesIO(), max_bytes=1000)


def test_a_short_slice_is_an_error_not_a_short_file(shell, tmp_path, small_slices):
    (tmp_path / "f").write_bytes(b"x" * 100)
    run = shell.run_command

    def short(sandbox, command, **kw):
        result = run(sandbox, command, **kw)
        if "dd " in command:
            return SandboxExecResult(exit_code=0, stdout=result.stdout[:8], stderr="")
        return result

    shell.run_command = short
    with pytest.raises(SandboxError, match="changed while it was exported|did not decode"):
        shell.export_file("s", str(tmp_path / "f"), io.BytesIO(), max_bytes=1000)


@pytest.mark.parametrize(
    "spec",
    [SandboxSpec(), SandboxSpec(block_network=False), SandboxSpec(allow_egress_to=["pypi.org"], allow_egress_to_cidrs=["203.0.113.0/24"])],
)
def test_network_stamp_round_trips_the_network_fields(spec):
    decoded = contract.decode_network_policy(contract.encode_network_policy(spec))
    assert decoded == SandboxSpec(
        block_network=spec.block_network,
        allow_egress_to=list(spec.allow_egress_to) if spec.allow_egress_to else None,
        allow_egress_to_cidrs=list(spec.allow_egress_to_cidrs) if spec.allow_egress_to_cidrs else None,
    )


def test_network_stamp_encoding_is_the_daemons():
    # The daemon writes airflow_network the same way (docs/protocol.md).
    assert contract.encode_network_policy(SandboxSpec()) == '{"allow_egress_to":[],"allow_egress_to_cidrs":[],"block_network":true}'


@pytest.mark.parametrize("value", ["", "not json", '{"block_network": true}', "[1, 2]", '{"allow_egress_to":1,"allow_egress_to_cidrs":[],"block_network":true}'])
def test_anything_else_is_not_a_network_stamp(value):
    with pytest.raises(ValueError, match="is not a network policy stamp"):
        contract.decode_network_policy(value)
    assert contract.read_network_stamp(value) is None
    assert contract.decode_network_policy(None) is None


def test_dag_run_owner_and_handles():
    assert contract.dag_run_owner({"ti": SimpleNamespace(dag_id="d", run_id="manual__1")}) == "d/manual__1"
    for missing in (None, "", "None", 7):
        assert not contract.is_sandbox_handle(missing)
    assert contract.is_sandbox_handle("sc-1@node-a")
