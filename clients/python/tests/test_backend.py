"""SidecarSandboxBackend against a fake daemon: the Airflow contract and the error mapping."""

from __future__ import annotations

import copy
import dataclasses
import pickle
import threading
import time
from pathlib import Path

import pytest

from fakedaemon import OpError, Session
from sandbox_sidecar import (
    ERROR_KINDS,
    MODEL,
    TERMINAL,
    UPSTREAM,
    AttachableSandboxBackend,
    AttachedSandbox,
    SandboxBackend,
    SandboxError,
    SandboxExecResult,
    SandboxFileTooLargeError,
    SandboxSpec,
    SandboxTerminalError,
    SidecarError,
    SidecarExecResult,
    SidecarSandboxBackend,
    check_resources,
    labels_from_context,
    to_sandbox_error,
)


def backend_for(fake_daemon, ops, **kwargs):
    limits = kwargs.pop("limits", None)
    daemon = fake_daemon(lambda s: s.serve(ops, limits=limits))
    return daemon, SidecarSandboxBackend(daemon.path, auto_labels=False, **kwargs)


def failing(code, message="", **details):
    def handler(args):
        raise OpError(code, message or f"{code} happened", **details)

    return handler


# -- the contract's shape ----------------------------------------------------------


def test_backend_is_an_attachable_sandbox_backend():
    assert issubclass(SidecarSandboxBackend, AttachableSandboxBackend)
    assert issubclass(SidecarSandboxBackend, SandboxBackend)
    assert SidecarSandboxBackend.name == "sidecar"
    assert issubclass(SandboxTerminalError, SandboxError)
    assert issubclass(SandboxFileTooLargeError, SandboxError)


def test_contract_classes_match_upstreams_shape():
    spec = SandboxSpec()
    assert (spec.env, spec.block_network, spec.allow_egress_to, spec.allow_egress_to_cidrs, spec.owner) == (
        None,
        True,
        None,
        None,
        None,
    )
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.owner = "x"  # type: ignore[misc]
    result = SandboxExecResult(exit_code=0, stdout="", stderr="")
    assert [f.name for f in dataclasses.fields(result)] == [
        "exit_code",
        "stdout",
        "stderr",
        "timed_out",
        "stdout_truncated",
        "stderr_truncated",
        "sandbox_terminated",
        "applied_timeout",
    ]
    with pytest.raises(dataclasses.FrozenInstanceError):
        result.exit_code = 1  # type: ignore[misc]
    assert [f.name for f in dataclasses.fields(AttachedSandbox)] == ["remaining_lifetime", "network", "workdir"]
    err = SandboxFileTooLargeError("a.txt", 10, 5)
    assert (err.path, err.size_bytes, err.max_bytes) == ("a.txt", 10, 5)


def test_upstream_classes_are_used_when_installed():
    try:
        import airflow.providers.common.ai.sandbox as upstream  # noqa: F401
    except ImportError:
        assert not UPSTREAM
        return
    assert UPSTREAM
    assert SandboxError is upstream.SandboxError
    assert SandboxTerminalError is upstream.SandboxTerminalError
    assert SandboxExecResult is upstream.SandboxExecResult


def test_construction_is_cheap_and_does_not_connect(tmp_path):
    backend = SidecarSandboxBackend(str(tmp_path / "no-daemon.sock"), labels={"dag_id": "d"}, ttl_s=60)
    assert backend._client is None
    assert "no-daemon.sock" in repr(backend)


def test_constructor_refuses_bad_options():
    with pytest.raises(ValueError):
        SidecarSandboxBackend(ttl_s=0)
    with pytest.raises(ValueError):
        SidecarSandboxBackend(op_timeout=-1)


def test_copies_and_pickles_start_unconnected(fake_daemon):
    daemon, backend = backend_for(
        fake_daemon, {"destroy": lambda a: {}}, ttl_s=30, labels={"team": "x"}, resources={"pids": 64}
    )
    backend.destroy("sc-1")
    for clone in (copy.deepcopy(backend), pickle.loads(pickle.dumps(backend))):
        assert clone._client is None
        assert clone._ttl_s == 30 and clone._labels == {"team": "x"}
        assert clone._resources == {"pids": 64}
        clone.destroy("sc-1")
        clone.close()
    backend.close()


def test_daemon_unreachable_is_terminal(tmp_path):
    backend = SidecarSandboxBackend(str(tmp_path / "none.sock"), connect_timeout=1)
    for call in (
        lambda: backend.create(),
        lambda: backend.run_command("sc-1", "true", timeout=5, max_output_bytes=100),
        lambda: backend.read_file("sc-1", "a", max_bytes=10),
        lambda: backend.destroy("sc-1"),
    ):
        with pytest.raises(SandboxTerminalError) as info:
            call()
        assert info.value.code == "daemon_unreachable"
        assert "none.sock" in str(info.value)


# -- create --------------------------------------------------------------------


def test_create_sends_the_spec_labels_and_ttl(fake_daemon):
    daemon, backend = backend_for(
        fake_daemon, {"create": lambda a: {"sandbox": "sc-1"}}, labels={"dag_id": "d", "try_number": 2}, ttl_s=90
    )
    spec = SandboxSpec(env={"A": "1"}, block_network=True, owner="d/r")
    assert backend.create(spec=spec) == "sc-1"
    assert backend.create(labels={"task_id": "t", "dag_id": "other"}, ttl_s=5) == "sc-1"
    assert backend.create(spec=SandboxSpec(allow_egress_to=["pypi.org"], allow_egress_to_cidrs=["10.0.0.0/8"]))
    first, second, third = daemon.args_of("create")
    assert first == {
        "spec": {"env": {"A": "1"}, "block_network": True, "owner": "d/r"},
        "labels": {"dag_id": "d", "try_number": "2"},
        "ttl_s": 90,
    }
    assert second == {"labels": {"dag_id": "other", "try_number": "2", "task_id": "t"}, "ttl_s": 5}
    assert third["spec"] == {
        "block_network": True,
        "allow_egress_to": ["pypi.org"],
        "allow_egress_to_cidrs": ["10.0.0.0/8"],
    }


def test_create_sends_resources_from_the_constructor_and_the_call(fake_daemon):
    daemon, backend = backend_for(
        fake_daemon,
        {"create": lambda a: {"sandbox": "sc-1"}},
        resources={"memory_bytes": 512 << 20, "cpus": 1, "pids": None},
    )
    backend.create()
    backend.create(spec=SandboxSpec(), resources={"cpus": 0.5, "disk_bytes": 1 << 30, "memory_bytes": None})
    first, second = daemon.args_of("create")
    assert first == {"resources": {"memory_bytes": 512 << 20, "cpus": 1}}
    assert second == {
        "spec": {"block_network": True},
        "resources": {"memory_bytes": 512 << 20, "cpus": 0.5, "disk_bytes": 1 << 30},
    }


def test_unenforceable_resources_are_terminal(fake_daemon):
    message = "memory_bytes is more than the 1073741824 this daemon allows; ask for less"
    daemon, backend = backend_for(fake_daemon, {"create": failing("spec_unenforceable", message)})
    with pytest.raises(SandboxTerminalError) as info:
        backend.create(resources={"memory_bytes": 8 << 30})
    assert info.value.code == "spec_unenforceable"
    assert str(info.value) == message


@pytest.mark.parametrize(
    "resources, fragment",
    [
        ("1G", "must be a mapping"),
        ({"memory": 1}, "unknown resources key 'memory'"),
        ({"memory_bytes": 0}, "memory_bytes'\\] must be an integer greater than 0, got 0"),
        ({"memory_bytes": -1}, "greater than 0"),
        ({"memory_bytes": 1.5e9}, "must be an integer"),
        ({"pids": True}, "must be an integer"),
        ({"disk_bytes": "10G"}, "must be an integer"),
        ({"cpus": float("nan")}, "positive finite"),
        ({"cpus": float("inf")}, "positive finite"),
        ({"cpus": 0}, "positive finite"),
        ({"cpus": "2"}, "positive finite"),
    ],
)
def test_bad_resources_are_refused_before_anything_is_sent(tmp_path, resources, fragment):
    with pytest.raises(ValueError, match=fragment):
        SidecarSandboxBackend(str(tmp_path / "none.sock"), resources=resources)
    backend = SidecarSandboxBackend(str(tmp_path / "none.sock"))
    with pytest.raises(ValueError, match=fragment):
        backend.create(resources=resources)
    assert backend._client is None, "nothing connected"


def test_check_resources_drops_nones_and_keeps_values():
    assert check_resources(None) == {}
    assert check_resources({"memory_bytes": 1, "cpus": 2.5, "pids": None}) == {"memory_bytes": 1, "cpus": 2.5}


def test_create_without_spec_labels_or_ttl_sends_nothing_extra(fake_daemon):
    daemon, backend = backend_for(fake_daemon, {"create": lambda a: {"sandbox": "sc-1"}})
    backend.create()
    assert daemon.args_of("create") == [{}]


def test_unenforceable_spec_is_terminal_with_the_daemons_message(fake_daemon):
    message = "the bwrap backend has no egress filter; allow_egress_to cannot be enforced"
    daemon, backend = backend_for(fake_daemon, {"create": failing("spec_unenforceable", message)})
    with pytest.raises(SandboxTerminalError) as info:
        backend.create(spec=SandboxSpec(allow_egress_to=["example.com"]))
    assert str(info.value) == message
    assert info.value.code == "spec_unenforceable"
    assert isinstance(info.value.sidecar_error, SidecarError)


@pytest.mark.parametrize("code", ["bad_request", "quota_exceeded", "internal"])
def test_every_create_failure_is_terminal(fake_daemon, code):
    daemon, backend = backend_for(fake_daemon, {"create": failing(code)})
    with pytest.raises(SandboxTerminalError):
        backend.create()


def test_labels_from_an_airflow_context():
    class TI:
        dag_id, run_id, task_id, try_number, map_index = "dag", "manual__2024", "task", 3, -1

    assert labels_from_context({"ti": TI()}) == {
        "dag_id": "dag",
        "run_id": "manual__2024",
        "task_id": "task",
        "try_number": "3",
        "map_index": "-1",
    }
    long_run = type("TI", (), {"run_id": "é" * 300})()
    assert len(labels_from_context({"ti": long_run})["run_id"].encode()) <= 256


# -- run_command ---------------------------------------------------------------


def test_run_command_result_mapping(fake_daemon):
    def run(args):
        return {
            "exit_code": 3,
            "stdout": b"caf\xc3\xa9 \xff",
            "stderr": b"oops",
            "stdout_truncated": True,
            "stderr_truncated": False,
            "timed_out": False,
            "sandbox_terminated": False,
            "applied_timeout_s": args["timeout_s"],
            "duration_s": 0.1,
            "something_new": 1,
        }

    daemon, backend = backend_for(fake_daemon, {"run_command": run})
    result = backend.run_command("sc-1", "python3 x.py", timeout=12, max_output_bytes=1000)
    assert isinstance(result, SandboxExecResult)
    assert result == SidecarExecResult(
        exit_code=3, stdout="café \ufffd", stderr="oops", stdout_truncated=True, applied_timeout=None
    )
    assert (result.reason, result.oom_killed, result.oom_kills) == ("exited", False, 0)
    assert daemon.args_of("run_command") == [
        {"sandbox": "sc-1", "command": "python3 x.py", "timeout_s": 12.0, "max_output_bytes": 1000}
    ]


def test_run_command_reports_a_shortened_timeout(fake_daemon):
    daemon, backend = backend_for(
        fake_daemon,
        {"run_command": lambda a: {"exit_code": 0, "stdout": b"", "stderr": b"", "timed_out": True,
                                   "applied_timeout_s": 42.5}},
    )
    result = backend.run_command("sc-1", "sleep 100", timeout=100, max_output_bytes=10)
    assert result.applied_timeout == 42.5 and result.timed_out


def test_run_command_reports_a_terminated_sandbox(fake_daemon):
    daemon, backend = backend_for(
        fake_daemon,
        {"run_command": lambda a: {"exit_code": 137, "stdout": b"", "stderr": b"", "sandbox_terminated": True,
                                   "applied_timeout_s": 5.0}},
    )
    assert backend.run_command("sc-1", "x", timeout=5, max_output_bytes=10).sandbox_terminated


def test_run_command_reports_an_oom_kill(fake_daemon):
    daemon, backend = backend_for(
        fake_daemon,
        {"run_command": lambda a: {"exit_code": 137, "stdout": b"", "stderr": b"Killed", "timed_out": False,
                                   "sandbox_terminated": False, "oom_killed": True, "oom_kills": 2,
                                   "reason": "oom_killed", "applied_timeout_s": 5.0}},
    )
    result = backend.run_command("sc-1", "python3 balloon.py", timeout=5, max_output_bytes=10)
    assert isinstance(result, SandboxExecResult)
    assert (result.exit_code, result.timed_out, result.sandbox_terminated) == (137, False, False)
    assert (result.reason, result.oom_killed, result.oom_kills) == ("oom_killed", True, 2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        result.reason = "exited"  # type: ignore[misc]


@pytest.mark.parametrize(
    "flags, reason",
    [
        ({}, "exited"),
        ({"oom_killed": True}, "oom_killed"),
        ({"oom_killed": True, "timed_out": True}, "timed_out"),
        ({"oom_killed": True, "timed_out": True, "sandbox_terminated": True}, "sandbox_terminated"),
        ({"sandbox_terminated": True}, "sandbox_terminated"),
    ],
)
def test_a_daemon_that_sends_no_reason_gets_one_from_its_flags(fake_daemon, flags, reason):
    daemon, backend = backend_for(
        fake_daemon, {"run_command": lambda a: {"exit_code": 137, "stdout": b"", "stderr": b"", **flags}}
    )
    result = backend.run_command("sc-1", "x", timeout=5, max_output_bytes=10)
    assert result.reason == reason
    assert result.oom_killed == bool(flags.get("oom_killed"))


def test_a_reason_from_the_daemon_is_kept_and_a_bad_count_ignored(fake_daemon):
    daemon, backend = backend_for(
        fake_daemon,
        {"run_command": lambda a: {"exit_code": 0, "stdout": b"", "stderr": b"", "reason": "something_new",
                                   "oom_kills": -3}},
    )
    result = backend.run_command("sc-1", "x", timeout=5, max_output_bytes=10)
    assert (result.reason, result.oom_kills) == ("something_new", 0)


def test_run_command_when_the_daemon_hangs_destroys_the_sandbox(fake_daemon):
    def script(session: Session) -> None:
        session.answer_hello()
        while True:
            request = session.recv()
            if request is None:
                return
            if request["op"] == "destroy":
                session.ok(request)
            # run_command: never answered

    daemon = fake_daemon(script)
    backend = SidecarSandboxBackend(daemon.path, grace=0.3, auto_labels=False)
    started = time.monotonic()
    result = backend.run_command("sc-1", "sleep 100", timeout=0.2, max_output_bytes=10)
    assert time.monotonic() - started < 2
    assert result.timed_out and result.sandbox_terminated
    assert result.reason == "sandbox_terminated"
    assert daemon.args_of("destroy") == [{"sandbox": "sc-1"}]
    backend.close()


def test_commands_for_one_sandbox_queue_in_the_backend_not_against_their_deadline(fake_daemon):
    """The daemon runs one command per sandbox at a time; a queued command's deadline must not tick."""

    def run(args):
        time.sleep(0.3)  # the fake answers in order, one at a time, like the daemon's per-sandbox queue
        return {"exit_code": 0, "stdout": b"", "stderr": b"", "applied_timeout_s": args["timeout_s"]}

    daemon = fake_daemon(lambda s: s.serve({"run_command": run, "destroy": lambda a: {}}))
    backend = SidecarSandboxBackend(daemon.path, grace=0.2, auto_labels=False)
    results = []
    threads = [
        threading.Thread(
            target=lambda: results.append(backend.run_command("sc-1", "x", timeout=0.3, max_output_bytes=10))
        )
        for _ in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    backend.close()
    assert [r.sandbox_terminated for r in results] == [False] * 4
    assert "destroy" not in daemon.ops_seen()


@pytest.mark.parametrize(
    "kwargs",
    [
        {"command": ["ls"], "timeout": 5, "max_output_bytes": 10},
        {"command": "ls", "timeout": 0, "max_output_bytes": 10},
        {"command": "ls", "timeout": float("nan"), "max_output_bytes": 10},
        {"command": "ls", "timeout": "5", "max_output_bytes": 10},
        {"command": "ls", "timeout": 5, "max_output_bytes": -1},
    ],
)
def test_mistyped_run_command_arguments_are_model_fixable(kwargs, tmp_path):
    backend = SidecarSandboxBackend(str(tmp_path / "unused.sock"))
    with pytest.raises(SandboxError) as info:
        backend.run_command("sc-1", **kwargs)
    assert not isinstance(info.value, SandboxTerminalError)
    assert backend._client is None  # refused before connecting


# -- files ---------------------------------------------------------------------


def test_file_ops_use_the_native_ops(fake_daemon):
    daemon, backend = backend_for(
        fake_daemon,
        {
            "write_file": lambda a: {"bytes_written": len(a["data"])},
            "read_file": lambda a: {"data": b"\x00binary\xff", "size_bytes": 8},
            "list_directory": lambda a: {
                "entries": [
                    {"name": "dir", "is_dir": True},
                    {"name": "line\nbreak", "is_dir": False},
                    {"name": b"caf\xe9", "is_dir": False},
                ]
            },
        },
    )
    backend.write_file("sc-1", "sub/dir/a.bin", b"\x00\x01")
    assert backend.read_file("sc-1", "a.bin", max_bytes=100) == b"\x00binary\xff"
    entries = backend.list_directory("sc-1", ".")
    assert entries == [("dir", True), ("line\nbreak", False), ("caf\udce9", False)]
    assert entries[2][0].encode("utf-8", "surrogateescape") == b"caf\xe9"
    assert daemon.args_of("write_file") == [{"sandbox": "sc-1", "path": "sub/dir/a.bin", "data": b"\x00\x01"}]
    assert daemon.args_of("read_file") == [{"sandbox": "sc-1", "path": "a.bin", "max_bytes": 100}]
    assert "run_command" not in daemon.ops_seen()


def test_read_file_too_large_carries_the_real_size(fake_daemon):
    daemon, backend = backend_for(
        fake_daemon, {"read_file": failing("file_too_large", "big", size_bytes=123456, max_bytes=100)}
    )
    with pytest.raises(SandboxFileTooLargeError) as info:
        backend.read_file("sc-1", "big.log", max_bytes=100)
    assert (info.value.path, info.value.size_bytes, info.value.max_bytes) == ("big.log", 123456, 100)
    assert not isinstance(info.value, SandboxTerminalError)


def test_read_file_never_returns_more_than_asked(fake_daemon):
    daemon, backend = backend_for(fake_daemon, {"read_file": lambda a: {"data": b"x" * 50, "size_bytes": 50}})
    with pytest.raises(SandboxFileTooLargeError) as info:
        backend.read_file("sc-1", "f", max_bytes=10)
    assert info.value.size_bytes == 50


def test_write_file_over_the_daemons_limit_goes_in_pieces(fake_daemon):
    daemon, backend = backend_for(fake_daemon, {"write_file": lambda a: {}}, limits={"max_file_bytes": 1000})
    content = bytes(range(256)) * 10  # 2560 bytes: three pieces of at most 1000
    backend.write_file("sc-1", "f", content)
    calls = daemon.args_of("write_file")
    assert [len(c["data"]) for c in calls] == [1000, 1000, 560]
    assert [c.get("offset") for c in calls] == [None, 1000, 2000], "the first replaces the file, the rest land at their offsets"
    assert b"".join(c["data"] for c in calls) == content
    assert "append" not in calls[1], "an offset write may be resent after a broken connection; an append may not"


def test_write_file_that_cannot_fit_a_frame_goes_in_pieces_that_do(fake_daemon):
    daemon, backend = backend_for(
        fake_daemon, {"write_file": lambda a: {}}, limits={"max_frame_bytes": 80 * 1024, "max_file_bytes": 1 << 20}
    )
    backend.write_file("sc-1", "f", b"x" * 40_000)
    assert [len(c["data"]) for c in daemon.args_of("write_file")] == [16 * 1024, 16 * 1024, 40_000 - 32 * 1024]


def test_a_path_msgpack_cannot_carry_is_model_fixable(fake_daemon):
    daemon, backend = backend_for(fake_daemon, {"read_file": lambda a: {"data": b""}})
    with pytest.raises(SandboxError) as info:
        backend.read_file("sc-1", "caf\udce9", max_bytes=10)
    assert not isinstance(info.value, SandboxTerminalError)


def test_destroy_tolerates_a_missing_handle(fake_daemon):
    daemon, backend = backend_for(fake_daemon, {"destroy": lambda a: {}})
    backend.destroy("")
    backend.destroy(None)  # type: ignore[arg-type]
    backend.destroy("sc-1")
    backend.destroy("sc-1")
    assert daemon.args_of("destroy") == [{"sandbox": "sc-1"}, {"sandbox": "sc-1"}]


# -- the error table -----------------------------------------------------------


@pytest.mark.parametrize("code", sorted(c for c in ERROR_KINDS if c != "file_too_large"))
def test_error_codes_map_to_the_documented_class(fake_daemon, code):
    daemon, backend = backend_for(fake_daemon, {"list_directory": failing(code, "the daemon's words", extra=1)})
    with pytest.raises(SandboxError) as info:
        backend.list_directory("sc-1", "somewhere")
    expected_terminal = ERROR_KINDS[code][0] == TERMINAL
    assert isinstance(info.value, SandboxTerminalError) is expected_terminal
    assert str(info.value) == "the daemon's words"
    assert info.value.code == code
    assert info.value.details == {"extra": 1}


def test_model_fixable_codes_are_exactly_the_documented_ones():
    fixable = {code for code, (kind, _) in ERROR_KINDS.items() if kind == MODEL}
    assert fixable == {
        "bad_request",
        "bad_path",
        "path_not_found",
        "is_a_directory",
        "not_a_directory",
        "too_many_entries",
        "file_too_large",
        "process_not_found",
        "process_ended",
        "context_not_found",
        "context_busy",
    }


def test_unknown_codes_are_terminal():
    exc = to_sandbox_error(SidecarError("brand_new_code", "something new"))
    assert isinstance(exc, SandboxTerminalError)


def test_the_doc_page_lists_every_code():
    doc = Path(__file__).resolve().parents[3] / "docs" / "airflow.md"
    text = doc.read_text()
    for code, (kind, _) in ERROR_KINDS.items():
        assert f"`{code}`" in text, f"docs/airflow.md does not mention {code}"


# -- attach and tags -----------------------------------------------------------


def test_attach_maps_the_daemons_answer(fake_daemon):
    network = '{"allow_egress_to":[],"allow_egress_to_cidrs":[],"block_network":true}'
    daemon, backend = backend_for(
        fake_daemon,
        {
            "attach": lambda a: {
                "remaining_s": 3500.5,
                "expires_at": time.time() + 3500,
                "workdir": "/workspace",
                "network": network,
                "holder": a["holder"],
            },
            "release": lambda a: {"released": True},
        },
    )
    attached = backend.attach("sc-1", owner="dag/run", holder="dag/run/task/1")
    assert attached.remaining_lifetime == 3500.5
    assert attached.workdir == "/workspace"
    assert attached.network == SandboxSpec(block_network=True)
    assert backend.release("sc-1", holder="dag/run/task/1") is None
    assert daemon.args_of("attach") == [{"sandbox": "sc-1", "owner": "dag/run", "holder": "dag/run/task/1"}]
    assert daemon.args_of("release") == [{"sandbox": "sc-1", "holder": "dag/run/task/1"}]


def test_attach_with_an_unreadable_network_tag_says_nothing_about_the_network(fake_daemon):
    daemon, backend = backend_for(
        fake_daemon, {"attach": lambda a: {"expires_at": time.time() + 100, "network": "not json", "workdir": ""}}
    )
    attached = backend.attach("sc-1", owner="o", holder="h")
    assert attached.network is None and attached.workdir is None
    assert 90 < attached.remaining_lifetime <= 100


@pytest.mark.parametrize(
    "code,details", [("owner_mismatch", {"owner": "other/run"}), ("held_by_other", {"holder": "t2"}), ("not_found", {})]
)
def test_refused_attach_is_terminal(fake_daemon, code, details):
    daemon, backend = backend_for(fake_daemon, {"attach": failing(code, "refused", **details)})
    with pytest.raises(SandboxTerminalError) as info:
        backend.attach("sc-1", owner="dag/run", holder="t1")
    assert info.value.code == code and info.value.details == details


def test_write_tags_sends_only_changes(fake_daemon):
    tags = {
        "airflow_owner": "d/r",
        "airflow_holder": "t1",
        "airflow_expires_at": "1700000000",
        "airflow_network": "{}",
        "airflow_workdir": "/workspace",
        "mine": "x",
    }
    daemon, backend = backend_for(
        fake_daemon, {"read_tags": lambda a: {"tags": dict(tags)}, "write_tags": lambda a: {"tags": {}}}
    )
    assert backend.read_tags("sc-1") == tags
    # read-modify-write of the whole map, as upstream's generic code does
    backend.write_tags("sc-1", {**tags, "airflow_holder": "t2", "new": "y"})
    # dropping the holder releases; dropping a plain tag empties it; read-only tags are never sent
    without = {k: v for k, v in tags.items() if k not in ("airflow_holder", "mine", "airflow_workdir")}
    backend.write_tags("sc-1", without)
    backend.write_tags("sc-1", tags)  # nothing changed: nothing sent
    assert daemon.args_of("write_tags") == [
        {"sandbox": "sc-1", "tags": {"airflow_holder": "t2", "new": "y"}},
        {"sandbox": "sc-1", "tags": {"airflow_holder": "", "mine": ""}},
    ]


def test_read_tags_of_a_gone_sandbox_is_terminal(fake_daemon):
    daemon, backend = backend_for(fake_daemon, {"read_tags": failing("not_found")})
    with pytest.raises(SandboxTerminalError):
        backend.read_tags("sc-gone")


def test_renew_and_destroy_run(fake_daemon):
    daemon, backend = backend_for(
        fake_daemon,
        {
            "renew": lambda a: {"expires_at": time.time() + a["ttl_s"], "remaining_s": float(a["ttl_s"])},
            "destroy_run": lambda a: {"destroyed": ["sc-1", "sc-2"]},
        },
    )
    assert backend.renew("sc-1", 600) == 600.0
    assert backend.destroy_run("dag/run") == ["sc-1", "sc-2"]
    assert backend.client.destroy_run("dag/run") == ["sc-1", "sc-2"]


def test_release_of_a_gone_sandbox_is_terminal_and_of_an_unheld_one_is_not(fake_daemon):
    gone = {"sc-gone"}

    def read_tags(a):
        if a["sandbox"] in gone:
            raise OpError("not_found", "no such sandbox")
        return {"tags": {"airflow_owner": "o", "airflow_holder": "", "airflow_workdir": "/workspace"}}

    daemon, backend = backend_for(fake_daemon, {"release": lambda a: {"released": False}, "read_tags": read_tags})
    backend.release("sc-1", holder="h")  # not held by h: nothing to do, and no error
    with pytest.raises(SandboxTerminalError) as info:
        backend.release("sc-gone", holder="h")
    assert info.value.code == "not_found"
    # an unset tag is left out
    assert backend.read_tags("sc-1") == {"airflow_owner": "o", "airflow_workdir": "/workspace"}


@pytest.mark.parametrize(
    "code,details,match",
    [
        ("owner_mismatch", {"owner": ""}, "'sc-1' on backend 'sidecar' is not owned by 'dag/run': it carries no owner"),
        ("owner_mismatch", {"owner": "other/run"}, "is not owned by 'dag/run': it carries owner 'other/run'"),
        ("held_by_other", {"holder": "dag/run/t2"}, "is already held by 'dag/run/t2'"),
    ],
)
def test_attach_refusals_use_upstreams_words(fake_daemon, code, details, match):
    daemon, backend = backend_for(fake_daemon, {"attach": failing(code, **details)})
    with pytest.raises(SandboxTerminalError, match=match) as info:
        backend.attach("sc-1", owner="dag/run", holder="dag/run/t1")
    assert info.value.code == code and info.value.details == details


def test_an_unreadable_network_stamp_is_logged_and_means_no_claim(fake_daemon, caplog):
    daemon, backend = backend_for(
        fake_daemon, {"attach": lambda a: {"remaining_s": 10.0, "workdir": "/workspace", "network": "open-ish"}}
    )
    assert backend.attach("sc-1", owner="o", holder="h").network is None
    assert "Sandbox sc-1 carries a network stamp this backend cannot read: 'open-ish'" in caplog.text
