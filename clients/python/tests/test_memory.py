"""Snapshots and forks with memory against the real daemon, through the
Airflow backend: on gVisor a prepared sandbox's running process (a token it
keeps in memory alone) comes back in sandboxes created from the snapshot and
in forks, each told it was restored; bwrap refuses ``memory=True`` with
``not_supported``. The gVisor tests need root and runsc; they skip without
them and fail under CI=true.
"""

import os

import pytest

from sandbox_sidecar import SidecarClient, SidecarSandboxBackend
from sandbox_sidecar.contract import SandboxTerminalError

# Draws a token at its start and keeps it in a variable; asked (/tmp/ask), it
# answers in /tmp/answer with the token and whether it sees the restored marker.
HOLDER = b"""import os, time
tok = os.urandom(8).hex()
while True:
    if not os.path.exists("/tmp/ask"):
        time.sleep(0.02)
        continue
    with open("/tmp/answer.tmp", "w") as f:
        f.write("%s %s" % (tok, os.path.exists("/tmp/.sandbox-restored")))
    os.rename("/tmp/answer.tmp", "/tmp/answer")
    os.remove("/tmp/ask")
"""

ASK = "rm -f /tmp/answer; touch /tmp/ask; for i in $(seq 250); do [ -s /tmp/answer ] && break; sleep 0.1; done; cat /tmp/answer"


def _ask(backend: SidecarSandboxBackend, sandbox: str) -> tuple:
    res = backend.run_command(sandbox, ASK, timeout=60, max_output_bytes=4096)
    fields = res.stdout.split()
    assert len(fields) == 2, f"the holder did not answer: {res.stdout!r} {res.stderr!r}"
    return fields[0], fields[1] == "True"


def test_a_memory_snapshot_and_forks_carry_the_running_process(gvisor_daemon):
    socket = gvisor_daemon.socket
    image = f"warm-{os.urandom(4).hex()}"
    with SidecarSandboxBackend(socket, ttl_s=600) as backend:
        source = backend.create()
        made = []
        try:
            backend.write_file(source, "holder.py", HOLDER)
            backend.start_command(source, "exec python3 /workspace/holder.py", name="holder")
            token, restored = _ask(backend, source)
            assert not restored

            snap = backend.snapshot(source, image, memory=True)
            assert snap["image"] == image and snap["frozen"] is True
            with SidecarClient(socket) as client:
                listed = {im["name"]: im for im in client.call("image_ls")["images"]}
            assert listed[image]["memory"] is True
            assert listed[image]["origin"]["sandbox"] == backend.sandbox_id(source)

            with SidecarSandboxBackend(socket, image=image, ttl_s=600) as later:
                made.append(later.create())
                assert _ask(later, made[-1]) == (token, True)

            forks = backend.fork(source, 2, memory=True)
            made += forks
            assert len(set(forks)) == 2 and source not in forks
            for f in forks:
                assert _ask(backend, f) == (token, True)
            assert _ask(backend, source) == (token, False), "the source ran on, unrestored"
        finally:
            for sb in made:
                backend.destroy(sb)
            backend.destroy(source)
    with SidecarClient(socket) as client:
        client.call("image_rm", {"name": image})


def test_bwrap_refuses_memory(sidecar_daemon):
    with SidecarSandboxBackend(sidecar_daemon.socket, ttl_s=600) as backend, SidecarClient(sidecar_daemon.socket) as client:
        sb = backend.create()
        before = sorted(s["sandbox"] for s in client.list_sandboxes())
        try:
            for attempt in (lambda: backend.snapshot(sb, f"mem-{os.urandom(4).hex()}", memory=True), lambda: backend.fork(sb, 1, memory=True)):
                with pytest.raises(SandboxTerminalError) as info:
                    attempt()
                assert info.value.code == "not_supported"
            assert sorted(s["sandbox"] for s in client.list_sandboxes()) == before, "a refused fork made sandboxes"
        finally:
            backend.destroy(sb)
