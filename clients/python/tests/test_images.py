"""Images against the real daemon: ``SidecarSandboxBackend(image=...)``.

An image is imported with the daemon's own CLI (as an operator would), from
a root filesystem tar made here of busybox-static alone: a root with no
python and no libc. Needs root (the CLI's import is for admins), bubblewrap
and /bin/busybox (busybox-static); skips without them, fails under CI=true.
"""

import io
import os
import subprocess
import tarfile

import pytest

from sandbox_sidecar import SidecarClient, SidecarSandboxBackend
from sandbox_sidecar.contract import SandboxTerminalError

from conftest import unavailable


def test_an_unknown_image_is_terminal_and_names_the_images_there_are(sidecar_daemon):
    with SidecarSandboxBackend(sidecar_daemon.socket, image="no-such-image") as backend:
        with pytest.raises(SandboxTerminalError) as info:
            backend.create()
    assert info.value.code == "image_not_found"
    assert "host" in info.value.details["images"]
    assert "no-such-image" in str(info.value)


def test_the_host_image_is_the_default(sidecar_daemon):
    with SidecarClient(sidecar_daemon.socket) as client:
        hello = client.hello()
        assert "images" in hello["features"]
        assert hello["images"][0] == "host"
        assert hello["default_image"] == "host"
    with SidecarSandboxBackend(sidecar_daemon.socket, image="host") as backend:
        sb = backend.create()
        listed = [s for s in backend.client.call("list")["sandboxes"] if sb.startswith(s["sandbox"])]
        assert listed[0]["image"] == "host"
        backend.destroy(sb)


def _busybox_rootfs() -> bytes:
    try:
        with open("/bin/busybox", "rb") as f:
            busybox = f.read()
    except OSError as exc:
        unavailable(f"needs busybox-static (/bin/busybox): {exc}")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for d in ("bin", "etc", "usr", "usr/bin"):
            info = tarfile.TarInfo(d)
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(info)
        info = tarfile.TarInfo("bin/busybox")
        info.size, info.mode = len(busybox), 0o755
        tar.addfile(info, io.BytesIO(busybox))
        for applet in ("sh", "echo", "cat", "ls", "true"):
            link = tarfile.TarInfo("bin/" + applet)
            link.type, link.linkname = tarfile.SYMTYPE, "busybox"
            tar.addfile(link)
    return buf.getvalue()


def test_a_backend_on_an_imported_image(sidecar_daemon, sidecar_binary, tmp_path):
    if os.geteuid() != 0:
        unavailable("importing an image is for admins: run as root")
    rootfs = tmp_path / "busybox.tar"
    rootfs.write_bytes(_busybox_rootfs())
    imported = subprocess.run(
        [sidecar_binary, "image", "import", str(rootfs), "--name", "py-busybox", "--socket", sidecar_daemon.socket],
        capture_output=True, text=True, timeout=120,
    )
    assert imported.returncode == 0, imported.stderr
    with SidecarSandboxBackend(sidecar_daemon.socket, image="py-busybox") as backend:
        sb = backend.create()
        try:
            res = backend.run_command(sb, "echo hello; ls /usr/bin/python3", timeout=30, max_output_bytes=4096)
            assert res.stdout.startswith("hello\n")
            assert res.exit_code != 0, "no python in the image"
            listed = [s for s in backend.client.call("list")["sandboxes"] if sb.startswith(s["sandbox"])]
            assert listed[0]["image"] == "py-busybox"
        finally:
            backend.destroy(sb)
