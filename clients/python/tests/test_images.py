"""Images against the real daemon: ``SidecarSandboxBackend(image=...)``."""

import pytest

from sandbox_sidecar import SidecarClient, SidecarSandboxBackend
from sandbox_sidecar.contract import SandboxTerminalError


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
