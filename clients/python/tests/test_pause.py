"""Paused sandboxes against the real daemon: the client's ``pause`` and
``resume``, and the Airflow backend's, as a DAG uses them (a task builds in
an owned sandbox and pauses it, a human-in-the-loop task waits, the next task
attaches and carries on). Needs bubblewrap and sandbox cgroups (root); skips
without them, fails under CI=true.
"""

import threading
import time
import uuid

import pytest

from conftest import unavailable, wait_until
from sandbox_sidecar import SandboxSpec, SidecarClient, SidecarError, SidecarSandboxBackend
from sandbox_sidecar.contract import SandboxTerminalError

# A durable process that prints the wall clock every 50 ms: a pause shows in
# its output as one long gap between two lines.
CLOCK = "while :; do date +%s.%N; sleep 0.05; done"


@pytest.fixture
def pausing_daemon(sidecar_daemon):
    with SidecarClient(sidecar_daemon.socket) as client:
        if "pause" not in client.hello()["features"]:
            unavailable("the daemon cannot pause here (bwrap without sandbox cgroups: not root?)")
    return sidecar_daemon


def _state(socket: str, sandbox: str) -> str:
    with SidecarClient(socket) as client:
        listed = {s["sandbox"]: s for s in client.list_sandboxes()}
    return listed[sandbox]["state"]


def _clock(backend: SidecarSandboxBackend, handle: str, process: str) -> list:
    out = backend.read_output(handle, process, max_bytes=1 << 20)
    return [float(line) for line in out.data.decode().split()]


def test_a_paused_sandbox_waits_for_the_next_task(pausing_daemon):
    socket = pausing_daemon.socket
    owner = f"dag/run-{uuid.uuid4().hex[:8]}"
    build = SidecarSandboxBackend(socket, ttl_s=600)  # the agent's task
    handle = build.create(spec=SandboxSpec(owner=owner))
    sandbox = build.sandbox_id(handle)
    try:
        build.attach(handle, owner=owner, holder="build")
        res = build.run_command(handle, "mkdir -p out && echo built > out/artifact", timeout=30, max_output_bytes=4096)
        assert res.exit_code == 0, res.stderr
        clock = build.start_command(handle, CLOCK, name="clock")
        assert wait_until(lambda: len(_clock(build, handle, clock.process)) >= 3, timeout=30)
        assert build.run_code(handle, "review = {'step': 1}").ok

        paused = build.pause(handle)
        assert paused["state"] == "paused"
        assert paused["memory_released"] is False  # bwrap freezes; the memory stays
        assert paused["paused_at"] > 0 and paused["remaining_s"] > 500
        assert build.pause(handle)["paused_at"] == paused["paused_at"], "a second pause changes nothing"
        build.release(handle, holder="build")

        # The human-in-the-loop task: it waits, and looking leaves the sandbox paused.
        time.sleep(1.5)
        assert _state(socket, sandbox) == "paused"

        # The next task attaches (which resumes) and carries on where the first left off.
        carry = SidecarSandboxBackend(socket)
        try:
            carry.attach(handle, owner=owner, holder="carry")
            assert _state(socket, sandbox) == "ready"
            assert carry.run_command(handle, "cat out/artifact", timeout=30, max_output_bytes=4096).stdout == "built\n"
            assert carry.run_code(handle, "review['step'] + 1").text == "2"
            info = carry.wait_process(handle, clock.process, timeout=0.1)
            assert info.running, "the durable process went on after the pause"
            assert wait_until(lambda: _clock(carry, handle, clock.process)[-1] > paused["paused_at"] + 1.5, timeout=30)
            stamps = _clock(carry, handle, clock.process)
            gaps = [b - a for a, b in zip(stamps, stamps[1:])]
            assert max(gaps) >= 1.2, f"no line stopped for the pause: the longest gap is {max(gaps):.3f} s"
            assert all(g >= 0 for g in gaps), "the clock went back: a new process, not the paused one"
        finally:
            carry.close()
    finally:
        build.destroy(handle)
        build.close()


def test_the_clients_pause_resume_and_refusals(pausing_daemon):
    socket = pausing_daemon.socket
    with SidecarClient(socket) as client:
        sandbox = client.create(ttl_s=600)["sandbox"]
        try:
            resumed = client.resume(sandbox)
            assert resumed["state"] == "ready", "resuming a running sandbox changes nothing"
            assert "paused_at" not in resumed

            # A pause of a sandbox that runs a command is refused, not half done.
            done = threading.Event()

            def command() -> None:
                with SidecarClient(socket) as other:
                    other.run_command(sandbox, "touch started; while [ ! -e go ]; do sleep 0.05; done", timeout_s=30)
                done.set()

            runner = threading.Thread(target=command)
            runner.start()
            assert wait_until(lambda: _exists(client, sandbox, "started"), timeout=30)
            with pytest.raises(SidecarError) as info:
                client.pause(sandbox)
            assert info.value.code == "busy"
            client.write_file(sandbox, "go", b"")
            runner.join(timeout=60)
            assert done.is_set()

            assert client.pause(sandbox)["state"] == "paused"
            assert _state(socket, sandbox) == "paused"
            back = client.resume(sandbox)
            assert back["state"] == "ready" and back["memory_released"] is False
            assert _state(socket, sandbox) == "ready"

            # Any use resumes: a command on a paused sandbox runs.
            client.pause(sandbox)
            assert client.run_command(sandbox, "echo awake")["stdout"] == b"awake\n"
            assert _state(socket, sandbox) == "ready"
        finally:
            client.destroy(sandbox)
        with pytest.raises(SidecarError) as info:
            client.pause(sandbox)
        assert info.value.code == "not_found"


def _exists(client: SidecarClient, sandbox: str, path: str) -> bool:
    try:
        client.read_file(sandbox, path, max_bytes=16)
        return True
    except SidecarError:
        return False


def test_the_backends_refusals_are_airflow_errors(pausing_daemon):
    backend = SidecarSandboxBackend(pausing_daemon.socket)
    try:
        with pytest.raises(SandboxTerminalError) as info:
            backend.pause("sb-no-such-sandbox")
        assert info.value.code == "not_found"
        with pytest.raises(SandboxTerminalError) as info:
            backend.resume("sb-no-such-sandbox")
        assert info.value.code == "not_found"
    finally:
        backend.close()
