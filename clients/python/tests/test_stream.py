"""Streamed output against the real daemon (bwrap backend)."""

from __future__ import annotations

import logging
import time

import pytest

from sandbox_sidecar import SandboxSpec, SidecarSandboxBackend

pytestmark = pytest.mark.integration

SLOW = "for i in 1 2 3 4 5 6; do echo line $i; echo err $i >&2; sleep 0.5; done"


@pytest.fixture
def sandbox(backend):
    handle = backend.create(spec=SandboxSpec())
    yield handle
    backend.destroy(handle)


def test_output_streams_while_the_command_runs(backend, sandbox):
    seen = []
    start = time.monotonic()
    result = backend.run_command(
        sandbox, SLOW, timeout=60, max_output_bytes=10_000, on_output=lambda s, d: seen.append((time.monotonic() - start, s, d))
    )
    took = time.monotonic() - start
    stdout = b"".join(d for _, s, d in seen if s == "stdout").decode()
    stderr = b"".join(d for _, s, d in seen if s == "stderr").decode()
    assert stdout == "".join(f"line {i}\n" for i in range(1, 7)) == result.stdout
    assert stderr == "".join(f"err {i}\n" for i in range(1, 7)) == result.stderr
    assert seen[0][0] < took / 2, f"the first chunk came at {seen[0][0]:.2f}s of {took:.2f}s"
    assert len(seen) >= 6


def test_a_flood_is_counted_not_buffered(backend, sandbox):
    got = [0]

    def slow(stream, data):
        got[0] += len(data)
        time.sleep(0.001)

    raw = backend.client.run_command(
        backend.sandbox_id(sandbox), "head -c 50000000 /dev/zero", timeout_s=120, max_output_bytes=1000, on_output=slow
    )
    assert got[0] + raw["stdout_stream_dropped"] == 50_000_000
    assert raw["stdout_truncated"] and len(raw["stdout"]) == 1000


def test_a_raising_callback_does_not_break_the_call(backend, sandbox):
    def boom(stream, data):
        raise RuntimeError("callback bug")

    result = backend.run_command(sandbox, "echo ok", timeout=30, max_output_bytes=100, on_output=boom)
    assert result.stdout == "ok\n"
    assert backend.run_command(sandbox, "echo again", timeout=30, max_output_bytes=100).stdout == "again\n"


def test_log_output_puts_lines_in_the_log_as_they_come(sidecar_daemon, caplog):
    caplog.set_level(logging.INFO, logger="sandbox_sidecar.output")
    with SidecarSandboxBackend(sidecar_daemon.socket, log_output=True) as backend:
        handle = backend.create(spec=SandboxSpec())
        try:
            backend.run_command(handle, "echo one; printf 'two\\nthr'; sleep 0.2; echo ee; echo bad >&2", timeout=30, max_output_bytes=100)
        finally:
            backend.destroy(handle)
    lines = [r.getMessage() for r in caplog.records if r.name == "sandbox_sidecar.output"]
    sid = handle.split("@")[0]
    assert f"[{sid} stdout] one" in lines and f"[{sid} stdout] two" in lines and f"[{sid} stdout] three" in lines
    assert f"[{sid} stderr] bad" in lines
