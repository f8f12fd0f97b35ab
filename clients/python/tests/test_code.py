"""Code contexts against the real daemon (bwrap backend): the plain client and the Airflow backend."""

from __future__ import annotations

import os
import subprocess
import threading
import time
from typing import List

import pytest

from conftest import unavailable, wait_until
from sandbox_sidecar import (
    ERROR_KINDS,
    MODEL,
    SandboxError,
    SandboxSpec,
    SandboxTerminalError,
    SidecarClient,
    SidecarCodeError,
    SidecarCodeResult,
    SidecarContextInfo,
    SidecarError,
    SidecarSandboxBackend,
)

pytestmark = pytest.mark.integration

# A class that shows itself as a notebook would: HTML, and a PNG's bytes.
PICTURE = '''
class Picture:
    def _repr_html_(self): return "<b>picture</b>"
    def _repr_png_(self): return b"\\x89PNG\\r\\n\\x1a\\n" + bytes(range(256)) * 4
    def __repr__(self): return "<Picture>"
'''


@pytest.fixture
def sandbox(backend):
    handle = backend.create(spec=SandboxSpec(), ttl_s=600)
    yield handle
    backend.destroy(handle)


def test_variables_persist_and_the_result_is_typed(backend, sandbox):
    first = backend.run_code(sandbox, "import csv, io\nrows = list(csv.reader(io.StringIO('a,b\\n1,2\\n3,4\\n')))\nprint('loaded', len(rows))")
    assert isinstance(first, SidecarCodeResult)
    assert (first.context, first.stdout, first.stderr, first.results, first.error) == ("default", "loaded 3\n", "", [], None)
    assert (first.execution_count, first.reason, first.ok, first.text) == (1, "ok", True, None)
    assert first.duration > 0 and not (first.timed_out or first.context_lost or first.oom_killed)
    again = backend.run_code(sandbox, "total = sum(int(r[0]) for r in rows[1:])\ntotal * 10")
    assert (again.execution_count, again.results, again.text) == (2, [{"text/plain": "40"}], "40")
    assert backend.list_contexts(sandbox) == [SidecarContextInfo(context="default", running=False, execution_count=2)]


def test_display_bundles_images_and_html(backend, sandbox):
    result = backend.run_code(sandbox, PICTURE + "display(Picture())\ndisplay({'k': [1, 2]})\n'done'")
    assert len(result.results) == 3
    picture, mapping, value = result.results
    assert picture["text/plain"] == "<Picture>" and picture["text/html"] == "<b>picture</b>"
    assert isinstance(picture["image/png"], bytes) and picture["image/png"].startswith(b"\x89PNG")
    assert result.images == [("image/png", picture["image/png"])]
    assert mapping == {"text/plain": "{'k': [1, 2]}"}
    assert value == {"text/plain": "'done'"} and result.text == "'done'"


def test_an_exception_is_a_result_and_the_context_goes_on(backend, sandbox):
    backend.run_code(sandbox, "x = 1")
    failed = backend.run_code(sandbox, "y = x + 1\n1 / 0")
    assert failed.reason == "error" and not failed.ok
    assert isinstance(failed.error, SidecarCodeError)
    assert (failed.error.name, failed.error.value) == ("ZeroDivisionError", "division by zero")
    assert "1 / 0" in failed.error.text and failed.error.text.endswith("ZeroDivisionError: division by zero\n")
    assert backend.run_code(sandbox, "y").text == "2", "what ran before the exception is kept"


def test_streamed_output_reaches_its_callbacks_while_the_cell_runs(backend, sandbox):
    seen: List[tuple] = []
    first_out = threading.Event()

    def on_stdout(data: bytes) -> None:
        seen.append(("stdout", data, time.monotonic()))
        first_out.set()

    code = "import sys, time\nprint('one', flush=True)\ntime.sleep(1.5)\nsys.stderr.write('two\\n')\nprint('three')"
    started = time.monotonic()
    result = backend.run_code(sandbox, code, on_stdout=on_stdout, on_stderr=lambda d: seen.append(("stderr", d, time.monotonic())))
    ended = time.monotonic()
    assert b"".join(d for s, d, _ in seen if s == "stdout") == b"one\nthree\n"
    assert b"".join(d for s, d, _ in seen if s == "stderr") == b"two\n"
    assert seen[0][1] == b"one\n" and seen[0][2] < ended - 1.0, "the first line came before the cell's end"
    assert (result.stdout, result.stderr) == ("one\nthree\n", "two\n")
    assert (result.stdout_stream_dropped, result.stderr_stream_dropped) == (0, 0)
    assert started < seen[0][2]


def test_a_timeout_interrupts_the_cell_and_keeps_the_context(backend, sandbox):
    backend.run_code(sandbox, "kept = 'yes'")
    result = backend.run_code(sandbox, "while True:\n    pass", timeout=1)
    assert (result.timed_out, result.context_lost, result.reason) == (True, False, "timed_out")
    assert result.error is not None and result.error.name == "KeyboardInterrupt"
    assert backend.run_code(sandbox, "kept").text == "'yes'"


def test_a_cell_that_ignores_the_interrupt_loses_only_its_context(backend, sandbox):
    backend.run_code(sandbox, "kept = 1")
    backend.run_code(sandbox, "other = 2", "other")
    # The handler is set by a cell of its own: an interrupt cannot come first.
    backend.run_code(sandbox, "import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)")
    lost = backend.run_code(sandbox, "while True:\n    pass", timeout=1)
    assert (lost.timed_out, lost.context_lost, lost.reason) == (True, True, "timed_out")
    fresh = backend.run_code(sandbox, "'kept' in globals()")
    assert (fresh.text, fresh.execution_count) == ("False", 1)
    assert backend.run_code(sandbox, "other", "other").text == "2", "another context lived on"
    assert backend.run_command(sandbox, "echo alive", timeout=30, max_output_bytes=100).stdout == "alive\n"


def test_two_contexts_share_nothing(backend, sandbox):
    backend.run_code(sandbox, "secret = 42", "a")
    assert backend.run_code(sandbox, "'secret' in globals()", "b").text == "False"
    names = [c.context for c in backend.list_contexts(sandbox)]
    assert names == ["a", "b"]


def test_restart_delete_and_their_refusals(backend, sandbox):
    backend.run_code(sandbox, "x = 1", "work")
    backend.run_code(sandbox, "x += 1", "work")
    backend.restart_context(sandbox, "work")
    assert [(c.context, c.execution_count) for c in backend.list_contexts(sandbox)] == [("work", 0)]
    fresh = backend.run_code(sandbox, "'x' in globals()", "work")
    assert (fresh.text, fresh.execution_count) == ("False", 1)
    backend.delete_context(sandbox, "work")
    assert backend.list_contexts(sandbox) == []
    for call in (lambda: backend.delete_context(sandbox, "work"), lambda: backend.restart_context(sandbox, "nope")):
        with pytest.raises(SandboxError) as info:
            call()
        assert info.value.code == "context_not_found" and not isinstance(info.value, SandboxTerminalError)
    with pytest.raises(SandboxError) as info:
        backend.run_code(sandbox, "1", "bad name")
    assert info.value.code == "bad_request"
    # Refused before anything is sent.
    for call in (
        lambda: backend.run_code(sandbox, b"1"),
        lambda: backend.run_code(sandbox, "1", ""),
        lambda: backend.run_code(sandbox, "1", timeout=0),
        lambda: backend.run_code(sandbox, "1", max_output_bytes=-1),
        lambda: backend.run_code(sandbox, "1", on_stdout="not callable"),
        lambda: backend.delete_context(sandbox, ""),
    ):
        with pytest.raises(SandboxError) as info:
            call()
        assert not hasattr(info.value, "code")
    assert ERROR_KINDS["context_not_found"][0] == MODEL and ERROR_KINDS["context_busy"][0] == MODEL


def test_the_plain_client_answers_the_daemons_maps(sidecar_daemon, backend, sandbox):
    with SidecarClient(sidecar_daemon.socket) as client:
        box = backend.sandbox_id(sandbox)
        events: List[tuple] = []
        res = client.run_code(box, "print('hi')\n6 * 7", context="raw", max_output_bytes=1000, on_output=lambda s, d: events.append((s, d)))
        assert res["stdout"] == b"hi\n" and res["results"] == [{"text/plain": "42"}] and res["reason"] == "ok"
        assert events == [("stdout", b"hi\n")]
        assert client.list_contexts(box) == [{"context": "raw", "running": False, "execution_count": 1}]
        client.restart_context(box, "raw")
        # A restarted context is made again by its next cell, as a new one.
        assert client.run_code(box, "'res' in globals()", context="raw")["execution_count"] == 1
        client.delete_context(box, "raw")
        with pytest.raises(SidecarError) as info:
            client.delete_context(box, "raw")
        assert info.value.code == "context_not_found"


def test_a_busy_context_is_the_models_to_wait_for(sidecar_daemon, backend, sandbox):
    box = backend.sandbox_id(sandbox)
    gone = SidecarClient(sidecar_daemon.socket)
    caught: List[BaseException] = []

    def long_cell() -> None:
        try:
            gone.run_code(box, "import time\ntime.sleep(60)", context="slow", timeout_s=60)
        except BaseException as exc:  # the connection is closed under it
            caught.append(exc)

    thread = threading.Thread(target=long_cell)
    thread.start()
    assert wait_until(lambda: any(c.running for c in backend.list_contexts(sandbox)), timeout=30)
    gone.close()  # the request goes away; its cell runs on to its budget
    thread.join(30)
    codes: List[str] = []

    def refused_busy() -> bool:
        try:
            backend.run_code(sandbox, "1", "slow", timeout=5)
        except SandboxError as exc:
            codes.append(getattr(exc, "code", ""))
            return codes[-1] == "context_busy"
        return False

    assert wait_until(refused_busy, timeout=30), codes
    assert caught and isinstance(caught[0], SidecarError) and caught[0].code == "client_closed"
    backend.delete_context(sandbox, "slow")  # ends the cell
    assert backend.run_code(sandbox, "1", "slow").text == "1"


def test_a_daemon_that_does_not_answer_in_time_ends_the_context(sidecar_daemon, sandbox):
    # No grace: the client gives up at the cell's budget, while the daemon
    # answers a cell that ignores its interrupt only after its kill grace.
    with SidecarSandboxBackend(sidecar_daemon.socket, grace=0) as impatient:
        impatient.run_code(sandbox, "kept = 1\nimport signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)", "patience")
        result = impatient.run_code(sandbox, "time.sleep(60)", "patience", timeout=1)
        assert (result.timed_out, result.context_lost, result.reason) == (True, True, "timed_out")
        assert "did not answer in time" in result.stderr
        # Ended by the backend then and there, not by the daemon at its kill grace.
        assert "patience" not in [c.context for c in impatient.list_contexts(sandbox)]
    with SidecarSandboxBackend(sidecar_daemon.socket) as backend:
        assert wait_until(lambda: not any(c.context == "patience" for c in backend.list_contexts(sandbox)), timeout=30)
        # The request the client gave up on holds the sandbox's command
        # slot until the daemon has seen its context end.
        fresh_results: List[SidecarCodeResult] = []

        def fresh_cell() -> bool:
            try:
                fresh_results.append(backend.run_code(sandbox, "'kept' in globals()", "patience"))
            except SandboxTerminalError as exc:
                assert exc.code == "quota_exceeded" and exc.details.get("scope") == "commands_per_sandbox"
                return False
            return True

        assert wait_until(fresh_cell, timeout=30)
        fresh = fresh_results[0]
        assert (fresh.text, fresh.execution_count) == ("False", 1)


def test_an_image_without_python_is_refused_with_no_python(sidecar_daemon, sidecar_binary, tmp_path):
    if os.geteuid() != 0:
        unavailable("importing an image is for admins: run as root")
    from test_images import _busybox_rootfs

    rootfs = tmp_path / "busybox.tar"
    rootfs.write_bytes(_busybox_rootfs())
    imported = subprocess.run(
        [sidecar_binary, "image", "import", str(rootfs), "--name", "code-busybox", "--socket", sidecar_daemon.socket],
        capture_output=True, text=True, timeout=120,
    )
    assert imported.returncode == 0, imported.stderr
    with SidecarSandboxBackend(sidecar_daemon.socket, image="code-busybox") as backend:
        sb = backend.create()
        try:
            with pytest.raises(SandboxTerminalError) as info:
                backend.run_code(sb, "1")
            assert info.value.code == "no_python"
        finally:
            backend.destroy(sb)
