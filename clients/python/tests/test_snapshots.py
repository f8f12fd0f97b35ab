"""Snapshots and forks against the real daemon: the client's ``snapshot`` and
``fork``, and the Airflow backend's, as a DAG uses them (prepare a sandbox,
snapshot it into an image, start later sandboxes from it). Needs bubblewrap;
skips without it, fails under CI=true.
"""

import os

import pytest

from sandbox_sidecar import SidecarClient, SidecarError, SidecarSandboxBackend
from sandbox_sidecar.contract import SandboxTerminalError


def _name(prefix: str) -> str:
    return f"{prefix}-{os.urandom(4).hex()}"


def test_a_snapshot_starts_later_sandboxes_with_its_files(sidecar_daemon):
    image = _name("prepared")
    with SidecarSandboxBackend(sidecar_daemon.socket, ttl_s=600) as backend:
        sb = backend.create()
        try:
            res = backend.run_command(
                sb, "mkdir -p env && echo ready > env/marker && echo cached > /tmp/cache", timeout=30, max_output_bytes=4096
            )
            assert res.exit_code == 0, res.stderr
            snap = backend.snapshot(sb, image)
            assert snap["image"] == image
            assert snap["digest"].startswith("sha256:")
            assert snap["base_image"] == "host"
            assert snap["files"] >= 3
        finally:
            backend.destroy(sb)
        with pytest.raises(SandboxTerminalError) as info:
            backend.snapshot(backend.create(), image)
        assert info.value.code == "image_exists"

    with SidecarSandboxBackend(sidecar_daemon.socket, image=image) as later:
        sb = later.create()
        try:
            res = later.run_command(sb, "cat env/marker /tmp/cache && echo more >> env/marker", timeout=30, max_output_bytes=4096)
            assert res.stdout == "ready\ncached\n", res.stderr
            assert res.exit_code == 0
        finally:
            later.destroy(sb)

    with SidecarClient(sidecar_daemon.socket) as client:
        listed = {im["name"]: im for im in client.call("image_ls")["images"]}
        assert listed[image]["source"] == "snapshot"
        assert listed[image]["base"] == "host"
        assert listed[image]["origin"]["base_image"] == "host"
        assert "snapshots" in client.hello()["features"]
        client.call("image_rm", {"name": image})


def test_forks_are_copies_with_the_sources_lease(sidecar_daemon):
    with SidecarSandboxBackend(sidecar_daemon.socket, ttl_s=600) as backend:
        source = backend.create()
        try:
            backend.write_file(source, "state.txt", b"from the source")
            forks = backend.fork(source, 2)
            assert len(forks) == 2 and source not in forks
            try:
                backend.write_file(forks[0], "state.txt", b"changed in fork 0")
                assert backend.read_file(forks[1], "state.txt", max_bytes=1024) == b"from the source"
                assert backend.read_file(source, "state.txt", max_bytes=1024) == b"from the source"
            finally:
                for f in forks:
                    backend.destroy(f)
        finally:
            backend.destroy(source)


def test_the_clients_fork_and_its_refusals(sidecar_daemon):
    with SidecarClient(sidecar_daemon.socket) as client:
        sb = client.create(ttl_s=600)["sandbox"]
        try:
            res = client.fork(sb, 1, owner="dag/other", ttl_s=120)
            assert len(res["sandboxes"]) == 1
            listed = {s["sandbox"]: s for s in client.list_sandboxes()}
            assert listed[res["sandboxes"][0]]["owner"] == "dag/other"
            client.destroy(res["sandboxes"][0])
            for count in (0, 17):
                with pytest.raises(SidecarError) as info:
                    client.fork(sb, count)
                assert info.value.code == "bad_request"
            with pytest.raises(SidecarError) as info:
                client.snapshot(sb, _name("mem"), memory=True)
            assert info.value.code == "not_supported"
        finally:
            client.destroy(sb)
