from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable, Iterator, List, Optional

import pytest

from fakedaemon import FakeDaemon, Session

CI = os.environ.get("CI", "").strip().lower() == "true"
REPO_ROOT = Path(__file__).resolve().parents[3]


def unavailable(reason: str) -> None:
    """Skip an integration test whose prerequisites are missing, except under CI=true, where it fails."""
    if CI:
        pytest.fail(f"{reason} (CI=true: integration tests must run)", pytrace=False)
    pytest.skip(reason)


@pytest.fixture
def fake_daemon() -> Iterator[Callable[[Callable[[Session], None]], FakeDaemon]]:
    """Start fake daemons running a per-connection script; all are stopped after the test."""
    started: List[FakeDaemon] = []

    def start(script: Callable[[Session], None]) -> FakeDaemon:
        daemon = FakeDaemon(script)
        started.append(daemon)
        return daemon

    yield start
    for daemon in started:
        daemon.close()
    for daemon in started:
        for exc in daemon.errors:
            raise exc


# -- the real daemon -----------------------------------------------------------


@pytest.fixture(scope="session")
def sidecar_binary(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The daemon binary: $SANDBOX_SIDECAR_BIN, or built once per session from this checkout."""
    prebuilt = os.environ.get("SANDBOX_SIDECAR_BIN")
    if prebuilt:
        if not os.access(prebuilt, os.X_OK):
            unavailable(f"SANDBOX_SIDECAR_BIN={prebuilt} is not an executable file")
        return prebuilt
    go = shutil.which("go")
    if go is None:
        unavailable("the Go toolchain is not installed and SANDBOX_SIDECAR_BIN is not set")
    if not (REPO_ROOT / "go.mod").exists():
        unavailable(f"no Go module at {REPO_ROOT} to build the daemon from")
    out = tmp_path_factory.mktemp("bin") / "sandbox-sidecar"
    build = subprocess.run(
        # Static, as the package builds it: the daemon is every sandbox's
        # init, and an image sandbox has no loader of the host's.
        [go, "build", "-buildmode=exe", "-o", str(out), "./cmd/sandbox-sidecar"],
        env={**os.environ, "CGO_ENABLED": "0"},
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if build.returncode != 0:
        pytest.fail(f"building the daemon failed:\n{build.stderr[-2000:]}", pytrace=False)
    return str(out)


class RunningDaemon:
    def __init__(self, binary: str, *extra_args: str) -> None:
        # A short directory: a Unix socket path must fit in 108 bytes.
        self.dir = tempfile.mkdtemp(prefix="ssc-it-")
        # The daemon runs sandboxes as an unprivileged uid that must be able to
        # traverse to its state directory.
        os.chmod(self.dir, 0o711)
        self.socket = os.path.join(self.dir, "run", "s.sock")
        self.binary = binary
        self.stderr_lines: List[str] = []
        # No config file unless the test names one: the host's
        # /etc/sandbox-sidecar/config.toml (a worker host with the package
        # installed has one) would give the test's daemon whatever that
        # host's operator set.
        config = [] if any(a == "--config" or a.startswith("--config=") for a in extra_args) else ["--config", "/dev/null"]
        # gc reads the backend (and gVisor's runsc) from the same config.
        self.config = next((b for a, b in zip(extra_args, extra_args[1:]) if a == "--config"), "/dev/null")
        self.proc = subprocess.Popen(
            [binary, "serve", *config, "--socket", self.socket, "--state-dir", os.path.join(self.dir, "state"), *extra_args],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            errors="replace",
        )
        self._ready = threading.Event()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.stderr_lines.append(line)
            if "is listening on" in line:
                self._ready.set()
        self._ready.set()  # exited: wake the waiter

    def wait_ready(self, timeout: float = 30.0) -> Optional[str]:
        """None when listening, else why not."""
        if not self._ready.wait(timeout):
            return f"the daemon did not report listening within {timeout}s"
        if self.proc.poll() is not None:
            return f"the daemon exited with {self.proc.returncode}:\n{self.log()[-2000:]}"
        return None

    def log(self) -> str:
        return "".join(self.stderr_lines)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        # A kept sandbox outlives its daemon (its init and durable
        # processes go on for the next one): end them with the test.
        subprocess.run(
            [self.binary, "gc", "--all", "--config", self.config, "--socket", self.socket, "--state-dir", os.path.join(self.dir, "state")],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=120,
            check=False,
        )
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="session")
def sidecar_daemon(sidecar_binary: str) -> Iterator[RunningDaemon]:
    """A real daemon for the session, with the bwrap backend."""
    if shutil.which("bwrap") is None:
        unavailable("bubblewrap (bwrap) is not installed")
    daemon = RunningDaemon(sidecar_binary)
    problem = daemon.wait_ready()
    if problem:
        daemon.stop()
        pytest.fail(problem, pytrace=False)
    from sandbox_sidecar import SidecarClient

    with SidecarClient(daemon.socket) as client:
        health = client.health()
    if health.get("status") != "ok":
        daemon.stop()
        unavailable(f"the daemon's backend is not usable here: {health.get('backend_error')}")
    yield daemon
    daemon.stop()


@pytest.fixture(scope="session")
def gvisor_daemon(sidecar_binary: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningDaemon]:
    """A real daemon for the session, with the gVisor backend and $SANDBOX_SIDECAR_RUNSC (scripts/test.sh sets it)."""
    runsc = os.environ.get("SANDBOX_SIDECAR_RUNSC") or shutil.which("runsc")
    if not runsc or not os.access(runsc, os.X_OK):
        unavailable("runsc is not installed (scripts/install-runsc.sh builds it; SANDBOX_SIDECAR_RUNSC names it)")
    if os.geteuid() != 0:
        unavailable("the gVisor backend needs root")
    config = tmp_path_factory.mktemp("gvisor") / "config.toml"
    config.write_text(f'[server]\nbackend = "gvisor"\n[gvisor]\nrunsc_path = "{runsc}"\n')
    daemon = RunningDaemon(sidecar_binary, "--config", str(config))
    problem = daemon.wait_ready(timeout=60)
    if problem:
        daemon.stop()
        pytest.fail(problem, pytrace=False)
    yield daemon
    daemon.stop()


@pytest.fixture
def backend(sidecar_daemon: RunningDaemon):
    from sandbox_sidecar import SidecarSandboxBackend

    b = SidecarSandboxBackend(sidecar_daemon.socket)
    yield b
    b.close()


def wait_until(predicate: Callable[[], bool], timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return predicate()
