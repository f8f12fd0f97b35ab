"""Durable processes against the real daemon (bwrap backend): the plain client and the Airflow backend."""

from __future__ import annotations

import os
import socket
import tempfile
import threading
import time
from typing import List, Optional

import pytest

from conftest import RunningDaemon, wait_until
from sandbox_sidecar import (
    SandboxError,
    SandboxSpec,
    SandboxTerminalError,
    SidecarClient,
    SidecarOutput,
    SidecarProcess,
    SidecarProcessInfo,
    SidecarSandboxBackend,
)

pytestmark = pytest.mark.integration

JOB = "for i in 1 2 3; do echo line $i; sleep 0.3; done; echo oops >&2; exit 4"


@pytest.fixture
def sandbox(backend):
    # Expiring, not bound to the backend's connection: the processes are
    # read from other clients too.
    handle = backend.create(spec=SandboxSpec(), ttl_s=600)
    yield handle
    backend.destroy(handle)


def lines(first: int, last: int) -> bytes:
    return b"".join(b"line %d\n" % i for i in range(first, last + 1))


def test_a_named_job_outlives_its_client_and_starts_once(sidecar_daemon, backend, sandbox):
    with SidecarClient(sidecar_daemon.socket) as first:
        started = first.start_command(backend.sandbox_id(sandbox), JOB, name="job")
    assert started["running"] and not started["existing"]
    # The client that started it is gone; a retry with the name starts nothing.
    again = backend.start_command(sandbox, "echo never", name="job")
    assert again == SidecarProcess(process=started["process"], name="job", existing=True, running=True)

    follower = backend.follow_output(sandbox, again.process)
    assert b"".join(follower) == lines(1, 3)
    assert (follower.exit_code, follower.reason, follower.running, follower.dropped) == (4, "exited", False, 0)
    assert follower.offset == len(lines(1, 3))
    assert b"".join(backend.follow_output(sandbox, again.process, stream="stderr")) == b"oops\n"
    assert b"".join(backend.follow_output(sandbox, again.process, offset=7)) == lines(2, 3)

    info = backend.wait_process(sandbox, again.process)
    assert isinstance(info, SidecarProcessInfo)
    assert (info.process, info.name, info.command, info.argv) == (again.process, "job", JOB, None)
    assert (info.running, info.exit_code, info.reason) == (False, 4, "exited")
    assert (info.stdout_bytes, info.stderr_bytes) == (21, 5)
    assert info.ended_at is not None and info.ended_at > info.started_at > time.time() - 600


def test_read_output_waits_for_bytes_and_reports_the_end(backend, sandbox):
    # It prints only once let go (a file), so the first read finds nothing.
    proc = backend.start_command(sandbox, ["sh", "-c", "while [ ! -e go ]; do sleep 0.05; done; printf first; sleep 0.5; exit 3"])
    empty = backend.read_output(sandbox, proc.process)
    assert empty == SidecarOutput(data=b"", offset=0, dropped=0, next_offset=0, running=True, exit_code=None, reason=None)
    started = time.monotonic()
    release = threading.Timer(0.3, lambda: backend.write_file(sandbox, "go", b""))
    release.start()
    first = backend.read_output(sandbox, proc.process, wait_s=30)
    release.join()
    assert first.data == b"first" and first.next_offset == 5
    assert time.monotonic() - started < 20, "the wait ended with the bytes, not at wait_s"
    end = backend.read_output(sandbox, proc.process, offset=first.next_offset, wait_s=30)
    assert (end.data, end.running, end.exit_code, end.reason) == (b"", False, 3, "exited")
    # A byte at a time, as max_bytes asks.
    assert backend.read_output(sandbox, proc.process, offset=1, max_bytes=2).data == b"ir"


def test_signal_wait_list_and_refusals(backend, sandbox):
    sleeper = backend.start_command(sandbox, ["sleep", "600"], name="sleeper")
    assert backend.wait_process(sandbox, sleeper.process, timeout=0.2).running
    assert backend.wait_process(sandbox, sleeper.process, timeout=0).running
    backend.signal_process(sandbox, sleeper.process, "INT")
    ended = backend.wait_process(sandbox, sleeper.process, timeout=30)
    assert (ended.running, ended.exit_code, ended.reason) == (False, 130, "killed")
    timed = backend.start_command(sandbox, "sleep 600", timeout=0.5)
    assert backend.wait_process(sandbox, timed.process, timeout=60).reason == "timed_out"
    listed = backend.list_processes(sandbox)
    assert [p.process for p in listed] == [sleeper.process, timed.process]
    assert listed[0].argv == ("sleep", "600") and listed[0].command is None and listed[0].name == "sleeper"

    with pytest.raises(SandboxError) as info:
        backend.signal_process(sandbox, sleeper.process, "TERM")
    assert info.value.code == "process_ended" and not isinstance(info.value, SandboxTerminalError)
    with pytest.raises(SandboxError) as info:
        backend.wait_process(sandbox, "p-000000000000")
    assert info.value.code == "process_not_found" and not isinstance(info.value, SandboxTerminalError)
    with pytest.raises(SandboxError) as info:
        backend.start_command(sandbox, "true", name="a/b")
    assert info.value.code == "bad_request"
    # Refused before anything is sent.
    for call in (
        lambda: backend.signal_process(sandbox, sleeper.process, "STOP"),
        lambda: backend.read_output(sandbox, sleeper.process, stream="both"),
        lambda: backend.read_output(sandbox, sleeper.process, offset=-1),
        lambda: backend.follow_output(sandbox, sleeper.process, wait_s=0),
        lambda: backend.start_command(sandbox, []),
        lambda: backend.start_command(sandbox, "true", timeout=-1),
        lambda: backend.wait_process(sandbox, ""),
    ):
        with pytest.raises(SandboxError):
            call()
    client = backend.client
    with pytest.raises(Exception) as raw:
        client.signal_process(backend.sandbox_id(sandbox), sleeper.process, "STOP")
    assert getattr(raw.value, "code", None) == "bad_request"


def test_a_gone_sandbox_is_terminal(backend):
    handle = backend.create(spec=SandboxSpec(), ttl_s=600)
    proc = backend.start_command(handle, "sleep 600")
    backend.destroy(handle)
    with pytest.raises(SandboxTerminalError) as info:
        backend.list_processes(handle)
    assert info.value.code == "not_found"
    with pytest.raises(SandboxTerminalError):
        next(iter(backend.follow_output(handle, proc.process)))


@pytest.fixture(scope="module")
def small_log_daemon(sidecar_daemon, sidecar_binary):
    """A daemon keeping 8 KiB of each stream, so a flood drops bytes."""
    conf = tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False)
    conf.write('[processes]\nlog_bytes = "8KiB"\n')
    conf.close()
    daemon = RunningDaemon(sidecar_binary, "--config", conf.name)
    try:
        problem = daemon.wait_ready()
        assert problem is None, problem
        yield daemon
    finally:
        daemon.stop()
        os.unlink(conf.name)


def test_a_flood_keeps_the_last_bytes_and_the_follower_says_what_was_dropped(small_log_daemon):
    with SidecarSandboxBackend(small_log_daemon.socket) as backend:
        handle = backend.create(spec=SandboxSpec(), ttl_s=600)
        try:
            proc = backend.start_command(handle, ["seq", "1", "100000"])
            done = backend.wait_process(handle, proc.process, timeout=60)
            total = sum(len(str(i)) + 1 for i in range(1, 100001))
            assert (done.exit_code, done.stdout_bytes) == (0, total)
            kept = total - (8 << 10)
            raw = backend.client.read_output(backend.sandbox_id(handle), proc.process)
            assert (raw["offset"], raw["dropped"], raw["next_offset"]) == (kept, kept, total)
            assert raw["data"].endswith(b"\n99999\n100000\n")
            drops = []
            follower = backend.follow_output(handle, proc.process, on_dropped=lambda at, n: drops.append((at, n)))
            assert b"".join(follower) == raw["data"]
            assert drops == [(0, kept)] and follower.dropped == kept
        finally:
            backend.destroy(handle)


class CutProxy:
    """A Unix socket forwarding to the daemon's that can cut every connection and refuse new ones.

    The daemon is the real one; to a client behind the proxy it went away
    and came back.
    """

    def __init__(self, target: str) -> None:
        self.target = target
        self.dir = tempfile.mkdtemp(prefix="ssc-px-")
        self.path = os.path.join(self.dir, "p.sock")
        self.listener: Optional[socket.socket] = None
        self.open: List[socket.socket] = []
        self.lock = threading.Lock()

    def listen(self) -> None:
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(self.path)
        listener.listen(16)
        self.listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            upstream.connect(self.target)
            with self.lock:
                self.open += [conn, upstream]
            for a, b in ((conn, upstream), (upstream, conn)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def cut(self) -> None:
        """Every connection through the proxy breaks, and nobody listens until :meth:`listen`."""
        assert self.listener is not None
        self.listener.close()
        os.unlink(self.path)
        with self.lock:
            for s in self.open:
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                s.close()
            self.open = []

    def close(self) -> None:
        if self.listener is not None:
            self.listener.close()
        with self.lock:
            for s in self.open:
                s.close()
        if os.path.exists(self.path):
            os.unlink(self.path)
        os.rmdir(self.dir)


SLOW = "for i in $(seq 1 30); do echo line $i; sleep 0.1; done; sleep 1; for i in $(seq 31 40); do echo line $i; done"


def follow_collecting(follower):
    got = bytearray()
    failure: List[BaseException] = []

    def run():
        try:
            for chunk in follower:
                got.extend(chunk)
        except BaseException as exc:  # the test reports it
            failure.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return got, failure, thread


def test_the_follower_goes_on_after_its_socket_is_closed_mid_read(backend, sandbox):
    proc = backend.start_command(sandbox, "echo line 1; echo line 2; echo line 3; sleep 1.5; " + SLOW.replace("seq 1 30", "seq 4 30"))
    follower = backend.follow_output(sandbox, proc.process)
    got, failure, thread = follow_collecting(follower)
    assert wait_until(lambda: bytes(got) == lines(1, 3), timeout=30), bytes(got)
    time.sleep(0.5)  # the follower now waits in a read on the daemon
    conn = backend.client._conn
    conn.sock.shutdown(socket.SHUT_RDWR)  # the client's own socket, mid-read
    thread.join(60)
    assert not thread.is_alive() and not failure, failure
    assert bytes(got) == lines(1, 40)
    assert backend.client._conn is not conn, "a new connection carried the rest"
    assert follower.exit_code == 0


def test_the_follower_reconnects_when_the_daemon_is_away_for_a_while(sidecar_daemon, backend, sandbox):
    proc = backend.start_command(sandbox, SLOW)
    proxy = CutProxy(sidecar_daemon.socket)
    proxy.listen()
    try:
        with SidecarClient(proxy.path, connect_timeout=2, grace=2) as client:
            follower = client.follow_output(backend.sandbox_id(sandbox), proc.process, reconnect_timeout=30)
            got, failure, thread = follow_collecting(follower)
            assert wait_until(lambda: b"line 3\n" in bytes(got), timeout=30), bytes(got)
            proxy.cut()
            time.sleep(1.0)  # nobody answers: the follower's reads fail and are tried again
            assert b"line 40\n" not in bytes(got), "the cut came before the end"
            proxy.listen()
            thread.join(60)
            assert not thread.is_alive() and not failure, failure
            assert bytes(got) == lines(1, 40), "every byte once"
            assert follower.reconnects > 0
            assert (follower.exit_code, follower.reason) == (0, "exited")
    finally:
        proxy.close()


def test_the_follower_gives_up_after_reconnect_timeout(sidecar_daemon, backend, sandbox):
    proc = backend.start_command(sandbox, "sleep 600")
    proxy = CutProxy(sidecar_daemon.socket)
    proxy.listen()
    try:
        with SidecarClient(proxy.path, connect_timeout=1, grace=1) as client:
            follower = client.follow_output(backend.sandbox_id(sandbox), proc.process, wait_s=0.2, reconnect_timeout=1)
            got, failure, thread = follow_collecting(follower)
            time.sleep(0.5)
            proxy.cut()
            thread.join(30)
            assert not thread.is_alive()
            assert len(failure) == 1 and getattr(failure[0], "code", None) in ("daemon_unreachable", "connection_lost")
    finally:
        proxy.close()
        backend.signal_process(sandbox, proc.process, "KILL")


def test_a_read_whose_offsets_do_not_add_up_is_refused():
    from sandbox_sidecar.errors import SidecarError
    from sandbox_sidecar.processes import output_from_wire

    good = {"data": b"abc", "offset": 10, "dropped": 4, "next_offset": 13, "running": True}
    assert output_from_wire(good, 6).next_offset == 13
    for bad in (
        {**good, "offset": 9},  # data would start before what was asked, plus what was dropped: a repeat
        {**good, "next_offset": 14},  # a gap after the data: a loss
        {**good, "data": "abc"},
        {k: v for k, v in good.items() if k != "next_offset"},
    ):
        with pytest.raises(SidecarError) as info:
            output_from_wire(bad, 6)
        assert info.value.code == "protocol_error"
