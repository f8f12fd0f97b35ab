"""The plain client against a fake daemon on a real Unix socket."""

from __future__ import annotations

import copy
import os
import pickle
import struct
import threading
import time

import msgpack
import pytest

from conftest import wait_until
from fakedaemon import OpError, Session
from sandbox_sidecar import (
    DEFAULT_SOCKET_PATH,
    SidecarClient,
    SidecarConnectionError,
    SidecarError,
    SidecarProtocolError,
    SidecarTimeoutError,
    resolve_socket_path,
)


def echo(args):
    return {"echo": args}


def serving(**ops):
    def script(session: Session) -> None:
        session.serve(ops)

    return script


def test_socket_path_resolution(monkeypatch):
    monkeypatch.delenv("SANDBOX_SIDECAR_SOCKET", raising=False)
    assert resolve_socket_path() == DEFAULT_SOCKET_PATH == "/run/sandbox-sidecar/sidecar.sock"
    monkeypatch.setenv("SANDBOX_SIDECAR_SOCKET", "/tmp/elsewhere.sock")
    assert resolve_socket_path() == "/tmp/elsewhere.sock"
    assert resolve_socket_path("/x.sock") == "/x.sock"
    assert SidecarClient().socket_path == "/tmp/elsewhere.sock"


def test_construction_does_not_connect(fake_daemon):
    daemon = fake_daemon(serving(health=lambda a: {"status": "ok"}))
    client = SidecarClient(daemon.path)
    time.sleep(0.1)
    assert daemon.connections == 0
    assert client.health() == {"status": "ok"}
    assert daemon.connections == 1
    client.close()


def test_hello_comes_first_and_one_connection_carries_every_call(fake_daemon):
    daemon = fake_daemon(serving(health=lambda a: {"status": "ok"}, destroy=lambda a: {}))
    with SidecarClient(daemon.path, client_name="unit") as client:
        client.health()
        client.destroy("sc-1")
        client.health()
        assert client.limits["max_file_bytes"] == 8 << 20
    assert daemon.connections == 1
    assert daemon.ops_seen() == ["hello", "health", "destroy", "health"]
    assert daemon.args_of("hello") == [{"versions": [1], "client": "unit"}]
    ids = [r["id"] for _, r in daemon.requests]
    assert ids == sorted(set(ids)) and ids[0] >= 1


def test_request_args_on_the_wire(fake_daemon):
    daemon = fake_daemon(serving(run_command=echo, write_file=echo, create=echo))
    with SidecarClient(daemon.path) as client:
        client.run_command("sc-1", "echo hi", timeout_s=3, max_output_bytes=10)
        client.write_file("sc-1", "a.txt", b"\x00\x01", mode=0o600)
        client.create({"block_network": True}, labels={"dag_id": "d"}, ttl_s=30)
    assert daemon.args_of("run_command") == [
        {"sandbox": "sc-1", "command": "echo hi", "timeout_s": 3, "max_output_bytes": 10}
    ]
    assert daemon.args_of("write_file") == [{"sandbox": "sc-1", "path": "a.txt", "data": b"\x00\x01", "mode": 0o600}]
    assert daemon.args_of("create") == [{"spec": {"block_network": True}, "labels": {"dag_id": "d"}, "ttl_s": 30}]


def test_create_sends_resources_and_run_command_passes_the_new_fields_through(fake_daemon):
    result = {"exit_code": 137, "stdout": b"", "stderr": b"", "oom_killed": True, "oom_kills": 1, "reason": "oom_killed"}
    daemon = fake_daemon(
        lambda s: s.serve({"create": lambda a: {"sandbox": "sc-1"}, "run_command": lambda a: result})
    )
    with SidecarClient(daemon.path) as client:
        client.create(resources={"memory_bytes": 64 << 20, "cpus": 0.5})
        client.create()
        got = client.run_command("sc-1", "x", timeout_s=5)
    assert daemon.args_of("create") == [{"resources": {"memory_bytes": 64 << 20, "cpus": 0.5}}, {}]
    assert (got["reason"], got["oom_killed"], got["oom_kills"]) == ("oom_killed", True, 1)


def test_error_response_becomes_exception_with_details(fake_daemon):
    def read_file(args):
        raise OpError("file_too_large", "it is big", size_bytes=5000, max_bytes=10)

    daemon = fake_daemon(serving(read_file=read_file))
    with SidecarClient(daemon.path) as client:
        with pytest.raises(SidecarError) as info:
            client.read_file("sc-1", "big", max_bytes=10)
    assert info.value.code == "file_too_large"
    assert info.value.message == "it is big"
    assert info.value.details == {"size_bytes": 5000, "max_bytes": 10}


def test_event_frames_are_ignored(fake_daemon):
    def script(session: Session) -> None:
        session.answer_hello()
        request = session.recv()
        session.send({"v": 1, "id": request["id"], "event": "stdout", "data": b"partial"})
        session.send({"v": 1, "id": 0, "event": "something-new"})
        session.ok(request, {"exit_code": 0})
        session.recv()

    daemon = fake_daemon(script)
    with SidecarClient(daemon.path) as client:
        assert client.run_command("sc-1", "true", timeout_s=5) == {"exit_code": 0}


def test_streamed_events_reach_on_output_in_order_before_the_result(fake_daemon):
    def script(session: Session) -> None:
        session.answer_hello()
        request = session.recv()
        assert request["args"]["stream"] is True
        for i in range(3):
            session.send({"v": 1, "id": request["id"], "event": "stdout", "data": b"out%d " % i})
        session.send({"v": 1, "id": request["id"], "event": "stderr", "data": b"err"})
        session.send({"v": 1, "id": request["id"] + 1000, "event": "stdout", "data": b"not ours"})
        session.ok(request, {"exit_code": 0, "stdout_stream_dropped": 0})
        session.recv()

    daemon = fake_daemon(script)
    seen = []
    with SidecarClient(daemon.path) as client:
        result = client.run_command("sc-1", "true", timeout_s=5, on_output=lambda s, d: seen.append((s, d)))
    assert result == {"exit_code": 0, "stdout_stream_dropped": 0}
    assert seen == [("stdout", b"out0 "), ("stdout", b"out1 "), ("stdout", b"out2 "), ("stderr", b"err")]


def test_oversize_length_prefix_fails_fast_without_reading_the_body(fake_daemon):
    """hello negotiates 4 KiB; a 5000-byte announcement is refused before its body arrives."""

    def script(session: Session) -> None:
        if session.index == 0:
            session.answer_hello({"max_frame_bytes": 4096})
            session.recv()
            session.send_raw(struct.pack(">I", 5000))  # and never send the body
            time.sleep(5)
        else:
            session.serve({"health": lambda a: {"status": "ok"}})

    daemon = fake_daemon(script)
    with SidecarClient(daemon.path, op_timeout=10) as client:
        started = time.monotonic()
        with pytest.raises(SidecarProtocolError) as info:
            client.health()
        assert time.monotonic() - started < 2
        assert info.value.details["frame_bytes"] == 5000
        assert info.value.details["max_frame_bytes"] == 4096
        # the next call starts over on a new connection
        assert client.health() == {"status": "ok"}
    assert daemon.connections == 2


def test_a_4_gib_length_prefix_is_refused(fake_daemon):
    def script(session: Session) -> None:
        session.answer_hello()
        session.recv()
        session.send_raw(b"\xff\xff\xff\xff" + b"x" * 100)
        time.sleep(2)

    daemon = fake_daemon(script)
    with SidecarClient(daemon.path) as client:
        with pytest.raises(SidecarProtocolError):
            client.health()


def test_the_client_sizes_frames_by_the_negotiated_maximum(fake_daemon):
    daemon = fake_daemon(lambda s: s.serve({"write_file": echo}, limits={"max_frame_bytes": 2048}))
    with SidecarClient(daemon.path) as client:
        with pytest.raises(SidecarError) as info:
            client.write_file("sc-1", "f", b"x" * 4096)
        assert info.value.code == "frame_too_large"
        assert info.value.details["max_frame_bytes"] == 2048
        client.write_file("sc-1", "f", b"x" * 100)  # the connection is untouched
    assert daemon.ops_seen() == ["hello", "write_file"]


def test_a_client_ceiling_below_the_daemons_limit_wins(fake_daemon):
    daemon = fake_daemon(lambda s: s.serve({"write_file": echo}))
    with SidecarClient(daemon.path, max_frame_bytes=2048) as client:
        with pytest.raises(SidecarError) as info:
            client.write_file("sc-1", "f", b"x" * 4096)
    assert info.value.details["max_frame_bytes"] == 2048


@pytest.mark.parametrize(
    "garbage",
    [
        struct.pack(">I", 3) + b"\xc1\xc1\xc1",  # not msgpack
        struct.pack(">I", 4) + msgpack.packb([1, 2, 3]),  # not a map
        struct.pack(">I", 0),  # empty frame
    ],
    ids=["not-msgpack", "not-a-map", "empty"],
)
def test_garbage_from_the_daemon_is_a_protocol_error(fake_daemon, garbage):
    def script(session: Session) -> None:
        if session.index == 0:
            session.answer_hello()
            session.recv()
            session.send_raw(garbage)
            time.sleep(1)
        else:
            session.serve({"health": lambda a: {"status": "ok"}})

    daemon = fake_daemon(script)
    with SidecarClient(daemon.path) as client:
        with pytest.raises(SidecarProtocolError):
            client.health()
        assert client.health() == {"status": "ok"}


def _closes_mid_response(times: int):
    """Answer hello, then on the first ``times`` connections cut the first response in half."""

    def script(session: Session) -> None:
        session.answer_hello()
        if session.index < times:
            request = session.recv()
            body = msgpack.packb({"v": 1, "id": request["id"], "ok": True, "result": {"data": b"x" * 100}})
            session.send_raw(struct.pack(">I", len(body)) + body[: len(body) // 2])
            return  # the handler closes the socket
        while True:
            request = session.recv()
            if request is None:
                return
            session.ok(request, {"data": b"whole", "size_bytes": 5, "exit_code": 0})

    return script


def test_reconnects_once_when_the_connection_breaks_mid_response(fake_daemon):
    daemon = fake_daemon(_closes_mid_response(times=1))
    with SidecarClient(daemon.path) as client:
        assert client.read_file("sc-1", "f")["data"] == b"whole"
    assert daemon.connections == 2
    assert daemon.ops_seen() == ["hello", "read_file", "hello", "read_file"]


def test_gives_up_when_the_connection_breaks_twice(fake_daemon):
    daemon = fake_daemon(_closes_mid_response(times=5))
    with SidecarClient(daemon.path) as client:
        with pytest.raises(SidecarConnectionError) as info:
            client.read_file("sc-1", "f")
    assert info.value.code == "connection_lost"
    assert daemon.ops_seen() == ["hello", "read_file", "hello", "read_file"]


@pytest.mark.parametrize("op", ["run_command", "create"])
def test_ops_that_must_not_run_twice_are_not_resent(fake_daemon, op):
    daemon = fake_daemon(_closes_mid_response(times=1))
    with SidecarClient(daemon.path) as client:
        with pytest.raises(SidecarConnectionError) as info:
            if op == "run_command":
                client.run_command("sc-1", "touch once", timeout_s=5)
            else:
                client.create()
        assert "unknown" in info.value.message
        # the client itself is fine: the next call uses a new connection
        assert client.read_file("sc-1", "f")["data"] == b"whole"
    assert daemon.ops_seen().count(op) == 1


def test_reconnects_after_the_daemon_closed_an_idle_connection(fake_daemon):
    """A daemon restart between calls: even run_command goes through, since it was never sent."""

    def script(session: Session) -> None:
        if session.index == 0:
            session.answer_hello()
            session.ok(session.recv(), {"status": "ok"})
            return  # close while idle
        session.serve({"run_command": lambda a: {"exit_code": 0}})

    daemon = fake_daemon(script)
    with SidecarClient(daemon.path) as client:
        client.health()
        wait_until(lambda: daemon.connections == 1 and len(daemon.requests) == 2)
        time.sleep(0.2)  # let the reader notice the close
        assert client.run_command("sc-1", "true", timeout_s=5) == {"exit_code": 0}
    assert daemon.ops_seen().count("run_command") == 1


def test_a_daemon_that_never_answers_times_out(fake_daemon):
    def script(session: Session) -> None:
        session.answer_hello()
        while session.recv() is not None:
            pass  # read everything, answer nothing

    daemon = fake_daemon(script)
    with SidecarClient(daemon.path, op_timeout=0.3, grace=0.2) as client:
        started = time.monotonic()
        with pytest.raises(SidecarTimeoutError) as info:
            client.health()
        assert 0.4 <= time.monotonic() - started < 2
        assert info.value.code == "client_timeout"
        # run_command waits for its own timeout plus the grace
        started = time.monotonic()
        with pytest.raises(SidecarTimeoutError):
            client.run_command("sc-1", "sleep 100", timeout_s=0.6)
        assert 0.75 <= time.monotonic() - started < 2.5


def test_a_daemon_that_never_says_hello_times_out(fake_daemon):
    def script(session: Session) -> None:
        session.recv()
        time.sleep(3)

    daemon = fake_daemon(script)
    with SidecarClient(daemon.path, connect_timeout=0.3, grace=0) as client:
        started = time.monotonic()
        with pytest.raises(SidecarTimeoutError):
            client.health()
        assert time.monotonic() - started < 1.5


def test_a_late_answer_is_dropped_and_the_connection_stays_usable(fake_daemon):
    def script(session: Session) -> None:
        session.answer_hello()
        slow = session.recv()
        time.sleep(0.6)
        session.ok(slow, {"which": "slow"})
        fast = session.recv()
        session.ok(fast, {"which": "fast"})
        session.recv()

    daemon = fake_daemon(script)
    with SidecarClient(daemon.path, op_timeout=0.2, grace=0.1) as client:
        with pytest.raises(SidecarTimeoutError):
            client.health()
        time.sleep(0.5)
        assert client.call("health", timeout=2) == {"which": "fast"}
    assert daemon.connections == 1


def test_responses_out_of_order_reach_the_right_caller(fake_daemon):
    """Two requests in flight; the daemon answers the second first."""

    def script(session: Session) -> None:
        session.answer_hello()
        first, second = session.recv(), session.recv()
        for request in (second, first):
            session.ok(request, {"path": request["args"]["path"]})
        session.recv()

    daemon = fake_daemon(script)
    results = {}
    with SidecarClient(daemon.path) as client:
        client.hello()

        def read(path):
            results[path] = client.read_file("sc-1", path)["path"]

        threads = [threading.Thread(target=read, args=(p,)) for p in ("a", "b")]
        for t in threads:
            t.start()
        for t in threads:
            t.join(5)
    assert results == {"a": "a", "b": "b"}


def test_many_threads_share_one_connection(fake_daemon):
    def slow_echo(args):
        time.sleep(0.001)
        return {"path": args["path"]}

    daemon = fake_daemon(serving(read_file=slow_echo))
    errors = []
    with SidecarClient(daemon.path) as client:

        def worker(n):
            try:
                for i in range(50):
                    path = f"{n}/{i}"
                    assert client.read_file("sc-1", path)["path"] == path
            except BaseException as exc:  # pragma: no cover - reported below
                errors.append(exc)

        threads = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
    assert not errors
    assert daemon.connections == 1
    assert daemon.ops_seen().count("read_file") == 400


def test_connection_level_error_fails_the_call_with_the_daemons_reason(fake_daemon):
    """An unauthorized peer gets one id-0 error frame and a closed connection."""

    def script(session: Session) -> None:
        session.fail(0, "unauthorized", "uid 1000 is not in group sandbox-sidecar")

    daemon = fake_daemon(script)
    with SidecarClient(daemon.path) as client:
        with pytest.raises(SidecarError) as info:
            client.health()
    assert info.value.code == "unauthorized"
    assert "sandbox-sidecar" in info.value.message


def test_unsupported_version_on_hello_is_reported(fake_daemon):
    def script(session: Session) -> None:
        request = session.recv()
        session.fail(request["id"], "unsupported_version", "speak 2", versions=[2])

    daemon = fake_daemon(script)
    with SidecarClient(daemon.path) as client:
        with pytest.raises(SidecarError) as info:
            client.health()
    assert info.value.code == "unsupported_version"
    assert info.value.details == {"versions": [2]}


def test_missing_socket_is_daemon_unreachable(tmp_path):
    with SidecarClient(str(tmp_path / "nothing.sock"), connect_timeout=1) as client:
        with pytest.raises(SidecarConnectionError) as info:
            client.health()
    assert info.value.code == "daemon_unreachable"
    assert "nothing.sock" in info.value.message


def test_socket_without_listener_is_daemon_unreachable(tmp_path):
    import socket

    path = str(tmp_path / "dead.sock")
    s = socket.socket(socket.AF_UNIX)
    s.bind(path)
    s.close()  # bound, never listening: connect is refused
    with SidecarClient(path, connect_timeout=1) as client:
        with pytest.raises(SidecarConnectionError) as info:
            client.health()
    assert info.value.code == "daemon_unreachable"


def test_closed_client_refuses_calls(fake_daemon):
    daemon = fake_daemon(serving(health=lambda a: {}))
    client = SidecarClient(daemon.path)
    client.health()
    client.close()
    with pytest.raises(SidecarConnectionError) as info:
        client.health()
    assert info.value.code == "client_closed"


def test_copies_start_unconnected(fake_daemon):
    daemon = fake_daemon(serving(health=lambda a: {"n": 1}))
    client = SidecarClient(daemon.path, op_timeout=7)
    client.health()
    for clone in (copy.deepcopy(client), pickle.loads(pickle.dumps(client))):
        assert clone._conn is None and clone.op_timeout == 7 and clone.socket_path == daemon.path
        assert clone.health() == {"n": 1}
        clone.close()
    client.close()


def test_exceptions_survive_pickling():
    err = pickle.loads(pickle.dumps(SidecarError("held_by_other", "held", {"holder": "t1"})))
    assert (err.code, err.message, err.details) == ("held_by_other", "held", {"holder": "t1"})
    err = pickle.loads(pickle.dumps(SidecarTimeoutError("slow", {"op": "health"})))
    assert (err.code, err.details) == ("client_timeout", {"op": "health"})


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_opens_its_own_connection(fake_daemon):
    daemon = fake_daemon(serving(health=lambda a: {"status": "ok"}))
    client = SidecarClient(daemon.path)
    client.health()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        code = 1
        try:
            code = 0 if client.health() == {"status": "ok"} else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    assert client.health() == {"status": "ok"}  # the parent's connection is untouched
    client.close()
    assert daemon.connections == 2


def test_invalid_options_are_refused_at_construction():
    with pytest.raises(ValueError):
        SidecarClient(op_timeout=0)
    with pytest.raises(ValueError):
        SidecarClient(connect_timeout=float("inf"))
    with pytest.raises(ValueError):
        SidecarClient(grace=-1)
