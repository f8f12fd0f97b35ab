"""Against the real daemon (built from this checkout, bwrap backend).

Skipped when Go or bubblewrap is missing, except under CI=true, where that fails.
Ops the daemon does not have yet (``unknown_op``) make their tests xfail, again
except under CI=true.
"""

from __future__ import annotations

import threading
import time
import uuid

import pytest

from conftest import CI
from sandbox_sidecar import (
    AttachedSandbox,
    SandboxError,
    SandboxFileTooLargeError,
    SandboxSpec,
    SandboxTerminalError,
    SidecarClient,
    SidecarError,
    SidecarSandboxBackend,
    split_handle,
)

pytestmark = pytest.mark.integration


def require_op(call):
    """Run ``call``; if the daemon does not know the op yet, xfail (fail under CI=true)."""
    try:
        return call()
    except (SandboxError, SidecarError) as exc:
        if getattr(exc, "code", None) != "unknown_op":
            raise
        reason = f"the daemon does not implement this op yet: {exc}"
        if CI:
            pytest.fail(f"{reason} (CI=true: not allowed to xfail)", pytrace=False)
        pytest.xfail(reason)


@pytest.fixture
def sandbox(backend):
    handle = backend.create(spec=SandboxSpec())
    yield handle
    backend.destroy(handle)


def test_create_write_run_read_list_destroy(backend):
    handle = backend.create(spec=SandboxSpec(env={"GREETING": "hello"}))
    assert handle.startswith("sc-")
    script = b"import os\nprint(os.environ['GREETING'], 6 * 7)\nopen('out/result.txt', 'w').write('done')\n"
    backend.write_file(handle, "script.py", script)
    backend.run_command(handle, "mkdir -p out", timeout=10, max_output_bytes=1000)
    result = backend.run_command(handle, "python3 script.py", timeout=30, max_output_bytes=10_000)
    assert (result.exit_code, result.stdout, result.stderr) == (0, "hello 42\n", "")
    assert not (result.timed_out or result.stdout_truncated or result.sandbox_terminated)
    assert result.applied_timeout is None
    assert backend.read_file(handle, "out/result.txt", max_bytes=100) == b"done"
    assert backend.read_file(handle, "script.py", max_bytes=10_000) == script
    assert backend.list_directory(handle, ".") == [("out", True), ("script.py", False)]
    assert backend.list_directory(handle, "out") == [("result.txt", False)]
    backend.destroy(handle)
    with pytest.raises(SandboxTerminalError) as info:
        backend.run_command(handle, "true", timeout=5, max_output_bytes=10)
    assert info.value.code == "not_found"


def test_failing_command_is_a_result_not_an_error(backend, sandbox):
    result = backend.run_command(sandbox, "echo to-stderr >&2; exit 3", timeout=10, max_output_bytes=100)
    assert (result.exit_code, result.stderr) == (3, "to-stderr\n")
    result = backend.run_command(sandbox, "no-such-program-here", timeout=10, max_output_bytes=1000)
    assert result.exit_code == 127 and result.stderr


def test_timeout(backend, sandbox):
    started = time.monotonic()
    result = backend.run_command(sandbox, "sleep 30", timeout=1, max_output_bytes=100)
    assert result.timed_out
    assert time.monotonic() - started < 10
    assert not result.sandbox_terminated
    # the sandbox is still usable afterwards
    assert backend.run_command(sandbox, "echo ok", timeout=10, max_output_bytes=100).stdout == "ok\n"


def test_timeout_that_ignores_sigterm(backend, sandbox):
    result = backend.run_command(sandbox, "trap '' TERM; sleep 30", timeout=1, max_output_bytes=100)
    assert result.timed_out


def test_timeout_above_the_daemons_cap_is_reported_as_applied(backend, sandbox):
    cap = backend.client.limits["max_timeout_s"]
    result = backend.run_command(sandbox, "true", timeout=cap + 1000, max_output_bytes=100)
    assert result.exit_code == 0
    assert result.applied_timeout == pytest.approx(cap)


def test_output_truncation_keeps_the_tail(backend, sandbox):
    command = "i=0; while [ $i -lt 5000 ]; do echo line-$i; i=$((i+1)); done; echo tail-marker; echo err >&2"
    result = backend.run_command(sandbox, command, timeout=30, max_output_bytes=1000)
    assert result.stdout_truncated and not result.stderr_truncated
    assert len(result.stdout.encode()) <= 1000
    assert result.stdout.endswith("line-4999\ntail-marker\n")
    assert result.stdout.startswith("line-")  # the partial first line was dropped
    assert result.stderr == "err\n"


def test_binary_output_is_decoded_with_replacement(backend, sandbox):
    result = backend.run_command(sandbox, r"printf 'ok \377\n'", timeout=10, max_output_bytes=100)
    assert result.stdout == "ok \ufffd\n"


def test_file_too_large(backend, sandbox):
    backend.write_file(sandbox, "big.bin", b"x" * 5000)
    with pytest.raises(SandboxFileTooLargeError) as info:
        backend.read_file(sandbox, "big.bin", max_bytes=100)
    assert (info.value.path, info.value.size_bytes, info.value.max_bytes) == ("big.bin", 5000, 100)
    assert backend.read_file(sandbox, "big.bin", max_bytes=5000) == b"x" * 5000


def test_a_write_larger_than_a_frame_goes_in_pieces(backend, sandbox):
    import hashlib
    import os as _os

    frame = backend.client.limits["max_frame_bytes"]
    content = _os.urandom(frame + 12345)  # past the daemon's per-write limit and a frame
    backend.write_file(sandbox, "huge/x.bin", content)
    result = backend.run_command(sandbox, "sha256sum huge/x.bin", timeout=60, max_output_bytes=1000)
    assert result.stdout.split()[0] == hashlib.sha256(content).hexdigest()


@pytest.mark.parametrize(
    "path,code",
    [
        ("", "bad_request"),
        ("a\x00b", "bad_path"),
        ("/etc/shadow", "path_not_found"),  # the host's is not in the sandbox
        ("does/not/exist.txt", "path_not_found"),
        (".", "is_a_directory"),
    ],
)
def test_bad_paths_are_model_fixable(backend, sandbox, path, code):
    with pytest.raises(SandboxError) as info:
        backend.read_file(sandbox, path, max_bytes=100)
    assert not isinstance(info.value, SandboxTerminalError)
    assert info.value.code == code
    assert str(info.value)  # a sentence the model can act on


def test_listing_a_file_is_model_fixable(backend, sandbox):
    backend.write_file(sandbox, "plain.txt", b"x")
    with pytest.raises(SandboxError) as info:
        backend.list_directory(sandbox, "plain.txt")
    assert not isinstance(info.value, SandboxTerminalError)
    assert info.value.code == "not_a_directory"


def test_reads_see_the_sandboxs_own_view(backend, sandbox):
    """Any path the guest sees, symlinks resolved inside; never the host's files."""
    guest = backend.run_command(sandbox, "cat /etc/passwd", timeout=10, max_output_bytes=100_000).stdout
    backend.run_command(sandbox, "ln -s /etc escape", timeout=10, max_output_bytes=100)
    for path in ("/etc/passwd", "escape/passwd", "../../etc/passwd"):
        assert backend.read_file(sandbox, path, max_bytes=100_000).decode() == guest
    with open("/etc/passwd", "rb") as host:
        assert backend.read_file(sandbox, "/etc/passwd", max_bytes=100_000) != host.read()
    names = dict(backend.list_directory(sandbox, "/usr"))
    assert names.get("bin") is True
    status = backend.read_file(sandbox, "/proc/self/status", max_bytes=100_000).decode()
    assert "\nUid:\t1000\t" in status
    with pytest.raises(SandboxFileTooLargeError):
        backend.read_file(sandbox, "/dev/zero", max_bytes=1024)


def test_writes_stay_in_the_workdir_and_tmp(backend, sandbox):
    backend.run_command(sandbox, "ln -s /etc escape", timeout=10, max_output_bytes=100)
    for path in ("escape/evil", "/etc/evil", "/usr/evil"):
        with pytest.raises(SandboxError) as info:
            backend.write_file(sandbox, path, b"x")
        assert info.value.code == "bad_path"


def test_a_file_the_guest_cannot_read_is_refused(backend, sandbox):
    backend.run_command(sandbox, "echo s > locked && chmod 000 locked", timeout=10, max_output_bytes=100)
    with pytest.raises(SandboxError) as info:
        backend.read_file(sandbox, "locked", max_bytes=100)
    assert info.value.code == "bad_path" and "permission denied" in str(info.value)


def test_tmp_is_reachable_by_absolute_path(backend, sandbox):
    backend.write_file(sandbox, "/tmp/scratch/x.txt", b"in tmp")
    result = backend.run_command(sandbox, "cat /tmp/scratch/x.txt", timeout=10, max_output_bytes=100)
    assert result.stdout == "in tmp"
    assert backend.list_directory(sandbox, "/tmp/scratch") == [("x.txt", False)]


def test_non_utf8_names_are_listed_with_surrogate_escapes(backend, sandbox):
    backend.run_command(
        sandbox, "python3 -c \"open(b'caf\\xe9', 'w').write('x')\"", timeout=10, max_output_bytes=1000
    )
    names = dict(backend.list_directory(sandbox, "."))
    assert "caf\udce9" in names
    # such a name cannot travel as a msgpack str: a model-fixable error, not a crash
    with pytest.raises(SandboxError) as info:
        backend.read_file(sandbox, "caf\udce9", max_bytes=10)
    assert not isinstance(info.value, SandboxTerminalError)


def test_egress_spec_is_refused_as_terminal(backend):
    with pytest.raises(SandboxTerminalError) as info:
        backend.create(spec=SandboxSpec(allow_egress_to=["pypi.org"]))
    assert info.value.code == "spec_unenforceable"
    assert str(info.value)  # the daemon's explanation
    with pytest.raises(SandboxTerminalError) as info:
        backend.create(spec=SandboxSpec(allow_egress_to_cidrs=["203.0.113.0/24"]))
    assert info.value.code == "spec_unenforceable"


def test_network_is_blocked(backend, sandbox):
    command = "python3 -c \"import socket; socket.create_connection(('1.1.1.1', 53), timeout=2)\""
    result = backend.run_command(sandbox, command, timeout=20, max_output_bytes=2000)
    assert result.exit_code != 0


def test_destroy_twice_and_unknown(backend):
    handle = backend.create()
    backend.destroy(handle)
    backend.destroy(handle)
    backend.destroy("sc-0000000000000000")


def test_eight_threads_on_one_backend(backend):
    errors = []
    barrier = threading.Barrier(8)

    def worker(n):
        try:
            barrier.wait(10)
            handle = backend.create(spec=SandboxSpec())
            try:
                backend.write_file(handle, f"w{n}.py", f"print({n} * 2)\n".encode())
                for _ in range(3):
                    result = backend.run_command(handle, f"python3 w{n}.py", timeout=30, max_output_bytes=100)
                    assert result.stdout == f"{n * 2}\n", result
                assert backend.read_file(handle, f"w{n}.py", max_bytes=100) == f"print({n} * 2)\n".encode()
                assert backend.list_directory(handle, ".") == [(f"w{n}.py", False)]
            finally:
                backend.destroy(handle)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
    started = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    assert time.monotonic() - started < 120


def test_commands_in_one_sandbox_from_many_threads(backend, sandbox):
    results = []

    def worker(n):
        results.append(backend.run_command(sandbox, f"echo {n} >> log; echo {n}", timeout=30, max_output_bytes=100))

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(r.stdout for r in results) == sorted(f"{n}\n" for n in range(8))
    lines = backend.read_file(sandbox, "log", max_bytes=1000).decode().split()
    assert sorted(lines) == sorted(str(n) for n in range(8))


def test_labels_are_recorded(backend, sidecar_daemon):
    b = SidecarSandboxBackend(sidecar_daemon.socket, labels={"dag_id": "d1", "task_id": "t1"})
    try:
        handle = b.create(labels={"try_number": 2, "map_index": -1})
        listed = {s["sandbox"]: s for s in b.client.list_sandboxes()}
        assert listed[b.sandbox_id(handle)]["labels"] == {"dag_id": "d1", "task_id": "t1", "try_number": "2", "map_index": "-1"}
        assert listed[b.sandbox_id(handle)]["conn_bound"] is True
        b.destroy(handle)
    finally:
        b.close()


def test_expiring_sandbox_renew_and_destroy_run(sidecar_daemon):
    owner = f"dag/run-{uuid.uuid4().hex[:8]}"
    with SidecarClient(sidecar_daemon.socket) as client:
        first = client.create({"owner": owner})
        second = client.create(ttl_s=60, spec={"owner": owner})
        assert first["conn_bound"] is False and second["conn_bound"] is False
        renewed = require_op(lambda: client.renew(second["sandbox"], 120))
        assert 100 < renewed["remaining_s"] <= 120
        destroyed = require_op(lambda: client.destroy_run(owner))
        assert sorted(destroyed) == sorted([first["sandbox"], second["sandbox"]])
        assert [s for s in client.list_sandboxes(owner=owner)] == []


def test_renew_of_a_connection_bound_sandbox_is_refused(backend, sandbox):
    with pytest.raises(SandboxError) as info:
        require_op(lambda: backend.renew(sandbox, 60))
    assert info.value.code == "bad_request"


def test_attach_and_release_rules(backend, sidecar_daemon):
    owner = f"dag/run-{uuid.uuid4().hex[:8]}"
    handle = backend.create(spec=SandboxSpec(owner=owner))
    other = SidecarSandboxBackend(sidecar_daemon.socket)  # another worker's task
    try:
        attached = require_op(lambda: backend.attach(handle, owner=owner, holder="task-a"))
        assert isinstance(attached, AttachedSandbox)
        assert attached.workdir == "/workspace"
        assert attached.network == SandboxSpec(block_network=True)
        assert 0 < attached.remaining_lifetime <= 3600

        # upstream's sentences, so a task log reads the same whichever backend ran
        with pytest.raises(SandboxTerminalError, match="already held by 'task-a'") as info:
            other.attach(handle, owner=owner, holder="task-b")
        assert info.value.code == "held_by_other"
        assert info.value.details.get("holder") == "task-a"

        with pytest.raises(SandboxTerminalError, match=f"not owned by 'dag/another-run'.*'{owner}'") as info:
            other.attach(handle, owner="dag/another-run", holder="task-b")
        assert info.value.code == "owner_mismatch"

        # the same holder may attach again (a task retry)
        other.attach(handle, owner=owner, holder="task-a")
        # releasing someone else's claim changes nothing
        other.release(handle, holder="task-b")
        with pytest.raises(SandboxTerminalError):
            other.attach(handle, owner=owner, holder="task-b")

        backend.release(handle, holder="task-a")
        backend.release(handle, holder="task-a")  # idempotent
        assert other.attach(handle, owner=owner, holder="task-b").workdir == "/workspace"
        # release never destroys
        other.release(handle, holder="task-b")
        assert backend.run_command(handle, "echo alive", timeout=10, max_output_bytes=100).stdout == "alive\n"
    finally:
        other.close()
        backend.destroy(handle)
    with pytest.raises(SandboxTerminalError) as info:
        backend.attach(handle, owner=owner, holder="task-a")
    assert info.value.code == "not_found"
    # gone: terminal for release too, as upstream has it
    with pytest.raises(SandboxTerminalError) as info:
        backend.release(handle, holder="task-a")
    assert info.value.code == "not_found"


def test_a_bare_handle_without_an_owner_is_refused_as_upstream_says(backend, sandbox):
    with pytest.raises(SandboxTerminalError, match="not owned by 'dag/run': it carries no owner") as info:
        backend.attach(sandbox, owner="dag/run", holder="dag/run/task")
    assert info.value.code == "owner_mismatch"
    assert "airflow_holder" not in backend.read_tags(sandbox), "a refused attach leaves no claim"


def test_concurrent_attach_has_exactly_one_winner(backend, sidecar_daemon):
    owner = f"dag/run-{uuid.uuid4().hex[:8]}"
    handle = backend.create(spec=SandboxSpec(owner=owner))
    require_op(lambda: backend.read_tags(handle))
    wins, refusals = [], []
    barrier = threading.Barrier(8)

    def contender(n):
        b = SidecarSandboxBackend(sidecar_daemon.socket)
        try:
            barrier.wait(10)
            b.attach(handle, owner=owner, holder=f"task-{n}")
            wins.append(n)
        except SandboxTerminalError as exc:
            refusals.append(exc.code)
        finally:
            b.close()

    threads = [threading.Thread(target=contender, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    backend.destroy(handle)
    assert len(wins) == 1 and refusals == ["held_by_other"] * 7


def test_tags(backend):
    owner = f"dag/run-{uuid.uuid4().hex[:8]}"
    handle = backend.create(spec=SandboxSpec(owner=owner))
    try:
        tags = require_op(lambda: backend.read_tags(handle))
        assert tags["airflow_owner"] == owner
        assert "airflow_holder" not in tags, "an unset tag is left out, as upstream's stores have it"
        assert tags["airflow_workdir"] == "/workspace"
        assert tags["airflow_network"] == '{"allow_egress_to":[],"allow_egress_to_cidrs":[],"block_network":true}'
        assert abs(int(tags["airflow_expires_at"]) - (time.time() + 3600)) < 120

        # upstream's generic read-modify-write of the whole map
        backend.write_tags(handle, {**tags, "airflow_holder": "task-x", "note": "hi"})
        after = backend.read_tags(handle)
        assert after["airflow_holder"] == "task-x" and after["note"] == "hi"
        with pytest.raises(SandboxTerminalError) as info:
            backend.attach(handle, owner=owner, holder="task-y")
        assert info.value.code == "held_by_other"

        # dropping the holder tag is a release
        backend.write_tags(handle, {k: v for k, v in after.items() if k != "airflow_holder"})
        assert "airflow_holder" not in backend.read_tags(handle)

        with pytest.raises(SidecarError) as info:
            backend.client.write_tags(backend.sandbox_id(handle), {"airflow_workdir": "/elsewhere"})
        assert info.value.code == "bad_request"
    finally:
        backend.destroy(handle)
    with pytest.raises(SandboxTerminalError):
        backend.read_tags(handle)


def test_connection_bound_sandbox_survives_a_quick_reconnect(sidecar_daemon):
    """A worker whose connection breaks gets its sandbox back by using it within the grace."""
    b = SidecarSandboxBackend(sidecar_daemon.socket)
    try:
        handle = b.create()
        b.write_file(handle, "keep.txt", b"kept")
        # simulate a broken connection under the backend
        b.client._conn.kill(RuntimeError("test: connection dropped"))
        assert b.read_file(handle, "keep.txt", max_bytes=10) == b"kept"
        b.destroy(handle)
    finally:
        b.close()


def test_unreachable_daemon_is_terminal(tmp_path):
    b = SidecarSandboxBackend(str(tmp_path / "nobody-listens.sock"))
    with pytest.raises(SandboxTerminalError) as info:
        b.create()
    assert info.value.code == "daemon_unreachable"


# -- why commands end, and per-sandbox resources ------------------------------------


def test_results_say_why_commands_ended(backend, sandbox):
    result = backend.run_command(sandbox, "exit 3", timeout=10, max_output_bytes=100)
    assert (result.exit_code, result.reason, result.oom_killed, result.oom_kills) == (3, "exited", False, 0)
    result = backend.run_command(sandbox, "trap '' TERM; sleep 30", timeout=1, max_output_bytes=100)
    assert (result.timed_out, result.reason, result.oom_killed) == (True, "timed_out", False)


def test_the_daemon_refuses_malformed_resources_and_announces_them(sidecar_daemon):
    with SidecarClient(sidecar_daemon.socket) as client:
        assert "create_resources" in client.hello()["features"]
        cases = [
            ({"memory": 1}, 'unknown resources field "memory"'),
            ({"cpus": float("nan")}, '"cpus" must be a finite number'),
            ({"pids": -1}, '"pids" must be greater than 0'),
            ({"memory_bytes": 1.5}, '"memory_bytes" must be an integer'),
        ]
        for resources, fragment in cases:
            with pytest.raises(SidecarError) as info:
                client.create(resources=resources)
            assert info.value.code == "bad_request", resources
            assert fragment in info.value.message
        assert client.list_sandboxes() == [], "nothing was made"


def limits_in_force(socket: str) -> dict:
    with SidecarClient(socket) as client:
        limits = client.health().get("limits")
    assert isinstance(limits, dict) and all(isinstance(v, str) for v in limits.values()), limits
    return limits


def test_health_reports_the_limits_in_force(sidecar_daemon):
    limits = limits_in_force(sidecar_daemon.socket)
    assert {"memory", "pids", "cpu", "disk"} <= set(limits)


def require_memory_limit(socket: str) -> None:
    limits = limits_in_force(socket)
    if limits.get("memory") in (None, "off"):
        unavailable_here(f"this host cannot enforce a memory limit (health says {limits.get('memory')!r})")


def unavailable_here(reason: str) -> None:
    if CI:
        pytest.fail(f"{reason} (CI=true: must run)", pytrace=False)
    pytest.skip(reason)


BALLOON = "python3 -c 'b = []\nwhile True: b.append(bytearray(1 << 20))'"


def test_a_memory_balloon_past_its_limit_is_oom_killed(sidecar_daemon):
    require_memory_limit(sidecar_daemon.socket)
    with SidecarSandboxBackend(sidecar_daemon.socket, resources={"memory_bytes": 64 << 20}) as backend:
        handle = backend.create()
        try:
            result = backend.run_command(handle, BALLOON, timeout=60, max_output_bytes=1000)
            assert (result.reason, result.oom_killed, result.exit_code) == ("oom_killed", True, 137), result
            assert not result.timed_out and result.oom_kills >= 1
            listed = [s for s in backend.client.list_sandboxes() if s["sandbox"] == backend.sandbox_id(handle)]
            assert listed[0]["resources"] == {"memory_bytes": 64 << 20}
        finally:
            backend.destroy(handle)


def test_resources_beyond_the_daemons_limits_are_refused(sidecar_daemon):
    require_memory_limit(sidecar_daemon.socket)
    with SidecarSandboxBackend(sidecar_daemon.socket) as backend:
        with pytest.raises(SandboxTerminalError) as info:
            backend.create(resources={"memory_bytes": 1 << 50})
        assert info.value.code == "spec_unenforceable"
        assert backend.client.list_sandboxes() == []


def test_a_handle_from_another_host_fails_naming_the_host_it_lives_on(sidecar_binary):
    import io as _io

    from conftest import RunningDaemon

    daemon = RunningDaemon(sidecar_binary, "--node-name", "node-a")
    try:
        problem = daemon.wait_ready()
        assert problem is None, problem
        with SidecarSandboxBackend(daemon.socket) as backend:
            handle = backend.create(spec=SandboxSpec())
            sandbox, host = split_handle(handle)
            assert (host, backend.sandbox_id(handle)) == ("node-a", sandbox)
            # The same sandbox, as a task scheduled on another worker would hold it.
            elsewhere = f"{sandbox}@node-b"
            calls = [
                lambda: backend.run_command(elsewhere, "true", timeout=5, max_output_bytes=10),
                lambda: backend.read_file(elsewhere, "x", max_bytes=10),
                lambda: backend.write_file(elsewhere, "x", b"x"),
                lambda: backend.list_directory(elsewhere, "."),
                lambda: backend.attach(elsewhere, owner="o", holder="h"),
                lambda: backend.release(elsewhere, holder="h"),
                lambda: backend.read_tags(elsewhere),
                lambda: backend.export_file(elsewhere, "x", _io.BytesIO(), max_bytes=10),
                lambda: backend.start_command(elsewhere, "true", name="job"),
                lambda: backend.read_output(elsewhere, "p-000000000000"),
                lambda: backend.follow_output(elsewhere, "p-000000000000"),
                lambda: backend.wait_process(elsewhere, "p-000000000000"),
                lambda: backend.signal_process(elsewhere, "p-000000000000"),
                lambda: backend.list_processes(elsewhere),
                lambda: backend.run_code(elsewhere, "1"),
                lambda: backend.list_contexts(elsewhere),
                lambda: backend.restart_context(elsewhere, "default"),
                lambda: backend.delete_context(elsewhere, "default"),
                lambda: backend.destroy(elsewhere),
            ]
            for call in calls:
                with pytest.raises(SandboxTerminalError, match="lives on host 'node-b'.*runs on 'node-a'") as info:
                    call()
                assert info.value.code == "wrong_host"
                assert info.value.details == {"host": "node-b", "this_host": "node-a"}
            # Nothing was done to it; the right handle and the bare id still reach it.
            assert backend.run_command(handle, "echo here", timeout=10, max_output_bytes=100).stdout == "here\n"
            assert backend.run_command(sandbox, "echo bare", timeout=10, max_output_bytes=100).stdout == "bare\n"
            backend.destroy(handle)
    finally:
        daemon.stop()
