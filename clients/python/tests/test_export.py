"""``export_file`` and ranged reads against the real daemon (bwrap backend).

Sizes from a small file to 1 GiB (sparse, so the test stays light on disk),
checked by SHA-256 against the sandbox's own ``sha256sum``; the refusals; and
the memory of the daemon and of this client while a 1 GiB file goes through.
"""

from __future__ import annotations

import hashlib
import io

import pytest

from conftest import RunningDaemon
from sandbox_sidecar import SandboxError, SandboxFileTooLargeError, SandboxSpec, SidecarSandboxBackend
from sandbox_sidecar import backend as backend_module

pytestmark = pytest.mark.integration

GIB = 1 << 30


class Hashing:
    """A dest that keeps a checksum and a count, never the bytes."""

    def __init__(self) -> None:
        self.sha = hashlib.sha256()
        self.n = 0

    def write(self, data: bytes) -> int:
        self.sha.update(data)
        self.n += len(data)
        return len(data)


def make_file(backend, sandbox, path: str, size: int) -> str:
    """A file of size bytes in the sandbox (sparse past 64 MiB) and its sha256 as the sandbox computes it."""
    if size <= 64 << 20:
        script = f"head -c {size} /dev/urandom > {path}"
    else:
        script = (
            f"truncate -s {size} {path} && printf head | dd of={path} conv=notrunc status=none && "
            f"printf tail | dd of={path} bs=1 seek={size - 4} conv=notrunc status=none"
        )
    result = backend.run_command(sandbox, f"{script} && sha256sum {path}", timeout=300, max_output_bytes=1000)
    assert result.exit_code == 0, result.stderr
    return result.stdout.split()[0]


@pytest.fixture
def sandbox(backend):
    handle = backend.create(spec=SandboxSpec())
    yield handle
    backend.destroy(handle)


@pytest.mark.parametrize("size", [1024, 3 * (1 << 20) + (1 << 19), 100 << 20], ids=["1KiB", "3.5MiB", "100MiB"])
def test_export_copies_the_file_exactly(backend, sandbox, size):
    want = make_file(backend, sandbox, "f.bin", size)
    dest = Hashing()
    assert backend.export_file(sandbox, "f.bin", dest, max_bytes=size) == size
    assert (dest.n, dest.sha.hexdigest()) == (size, want)


def test_a_small_export_into_a_bytes_buffer(backend, sandbox):
    backend.write_file(sandbox, "report.csv", b"a,b\n1,2\n")
    dest = io.BytesIO()
    assert backend.export_file(sandbox, "report.csv", dest, max_bytes=100) == 8
    assert dest.getvalue() == backend.read_file(sandbox, "report.csv", max_bytes=100)


def peak_kib(pid: str = "self") -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    raise AssertionError("no VmHWM")


def rss_kib(pid: str = "self") -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


def test_a_1gib_export_keeps_daemon_and_client_memory_bounded(sidecar_binary):
    daemon = RunningDaemon(sidecar_binary)  # its own, so its peak is this test's
    try:
        problem = daemon.wait_ready()
        assert problem is None, problem
        with SidecarSandboxBackend(daemon.socket) as backend:
            sandbox = backend.create(spec=SandboxSpec())
            want = make_file(backend, sandbox, "sparse.bin", GIB)
            pid = str(daemon.proc.pid)
            daemon_before = peak_kib(pid)
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")  # restart this process's peak RSS from now
            client_before = rss_kib()
            dest = Hashing()
            assert backend.export_file(sandbox, "sparse.bin", dest, max_bytes=GIB) == GIB
            assert dest.sha.hexdigest() == want
            daemon_growth = peak_kib(pid) - daemon_before
            client_growth = peak_kib() - client_before
            print(f"1 GiB export: daemon peak RSS +{daemon_growth} KiB, client peak RSS +{client_growth} KiB")
            assert daemon_growth < 64 << 10, f"the daemon grew by {daemon_growth} KiB"
            assert client_growth < 64 << 10, f"this client grew by {client_growth} KiB"
            backend.destroy(sandbox)
    finally:
        daemon.stop()


def test_a_budget_smaller_than_the_file_refuses_before_writing(backend, sandbox):
    make_file(backend, sandbox, "f.bin", 5000)
    dest = io.BytesIO()
    with pytest.raises(SandboxFileTooLargeError) as info:
        backend.export_file(sandbox, "f.bin", dest, max_bytes=4999)
    assert (info.value.path, info.value.size_bytes, info.value.max_bytes) == ("f.bin", 5000, 4999)
    assert dest.getvalue() == b""


@pytest.mark.parametrize(
    "setup,path,match",
    [
        ("mkdir d", "d", "is a directory"),
        ("mkfifo p", "p", "not a regular file"),
        ("true", "missing.bin", "does not exist"),
    ],
)
def test_what_is_not_a_regular_file_is_refused(backend, sandbox, setup, path, match):
    backend.run_command(sandbox, setup, timeout=10, max_output_bytes=100)
    dest = io.BytesIO()
    with pytest.raises(SandboxError, match=match):
        backend.export_file(sandbox, path, dest, max_bytes=1000)
    assert dest.getvalue() == b""


def test_a_device_is_refused_not_read_without_end(backend, sandbox):
    with pytest.raises(SandboxError):
        backend.export_file(sandbox, "/dev/zero", io.BytesIO(), max_bytes=1000)


class GrowOnFirstWrite:
    """A dest that appends to the file being exported the first time it is written to."""

    def __init__(self, backend, sandbox, path, extra: bytes) -> None:
        self.backend, self.sandbox, self.path, self.extra = backend, sandbox, path, extra
        self.grown = False

    def write(self, data: bytes) -> int:
        if not self.grown:
            self.grown = True
            self.backend.client.write_file(self.backend.sandbox_id(self.sandbox), self.path, self.extra, append=True)
        return len(data)


def test_a_file_that_changes_during_the_export_is_an_error(backend, sandbox):
    make_file(backend, sandbox, "grow.bin", 3 << 20)
    dest = GrowOnFirstWrite(backend, sandbox, "grow.bin", b"more")
    with pytest.raises(SandboxError, match="changed while it was exported") as info:
        backend.export_file(sandbox, "grow.bin", dest, max_bytes=8 << 20)
    assert not isinstance(info.value, SandboxFileTooLargeError)


def test_a_file_that_grows_past_the_budget_during_the_export_is_too_large(backend, sandbox):
    make_file(backend, sandbox, "grow.bin", 3 << 20)
    dest = GrowOnFirstWrite(backend, sandbox, "grow.bin", b"more")
    with pytest.raises(SandboxFileTooLargeError):
        backend.export_file(sandbox, "grow.bin", dest, max_bytes=(3 << 20) + 2)


def test_an_export_is_bounded_by_its_deadline(backend, sandbox, monkeypatch):
    # No guest can trickle a file through a native ranged read, but a slow
    # daemon or host can: only the whole copy's deadline bounds that.
    make_file(backend, sandbox, "f.bin", 3 << 20)
    monkeypatch.setattr(backend_module, "export_deadline", lambda max_bytes: 0.0)
    with pytest.raises(SandboxError, match="took longer than"):
        backend.export_file(sandbox, "f.bin", io.BytesIO(), max_bytes=8 << 20)


def test_ranged_reads_through_the_client(backend, sandbox):
    backend.write_file(sandbox, "r.txt", b"0123456789")
    sid = backend.sandbox_id(sandbox)
    piece = backend.client.read_file_range(sid, "r.txt", offset=3, length=4)
    assert (piece["data"], piece["size_bytes"], piece["eof"]) == (b"3456", 10, False)
    assert backend.client.read_file_range(sid, "r.txt", length=0)["size_bytes"] == 10
    assert backend.client.write_file(sid, "r.txt", b"!", append=True)["size_bytes"] == 11
    assert backend.read_file(sandbox, "r.txt", max_bytes=100) == b"0123456789!"
