"""With the Airflow provider importable, the backend must be built on its classes.

The provider is not installed here, so a minimal stand-in package with the
provider's module layout is written to a temp dir and imported in a child
interpreter. The stand-in follows the shape of upstream's newest base class
as last checked: apache/airflow 01f824e6f71b77aa1c607d33edb26a96988d422b
(``providers/common/ai/src/airflow/providers/common/ai/sandbox/base.py`` and its
``test_base.py``): concrete file operations and ``export_file``, the helpers
``dag_run_owner``, ``encode_network_policy``, ``decode_network_policy`` (raising
``ValueError`` on a malformed stamp) and ``is_sandbox_handle``. Its method
bodies are not upstream's: each default raises, so a test fails if the
backend ever falls back to one instead of its native operation.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"

BASE = '''
from __future__ import annotations
import abc
from dataclasses import dataclass
from typing import Any, Optional

class SandboxError(Exception):
    pass

class SandboxTerminalError(SandboxError):
    pass

class SandboxFileTooLargeError(SandboxError):
    def __init__(self, path, size_bytes, max_bytes):
        self.path, self.size_bytes, self.max_bytes = path, size_bytes, max_bytes
        super().__init__(path)

@dataclass(frozen=True)
class SandboxSpec:
    env: Any = None
    block_network: bool = True
    allow_egress_to: Any = None
    allow_egress_to_cidrs: Any = None
    owner: Optional[str] = None

@dataclass(frozen=True)
class SandboxExecResult:
    exit_code: int
    stdout: str
    stderr: str
    timed_out: bool = False
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    sandbox_terminated: bool = False
    {extra_field}

@dataclass(frozen=True)
class AttachedSandbox:
    remaining_lifetime: Optional[float]
    network: Optional[SandboxSpec]
    workdir: Optional[str]

class SandboxBackend(abc.ABC):
    @abc.abstractmethod
    def create(self, *, spec=None): ...
    @abc.abstractmethod
    def run_command(self, sandbox, command, *, timeout, max_output_bytes): ...
    def read_file(self, sandbox, path, *, max_bytes): raise AssertionError("shell default used")
    def write_file(self, sandbox, path, content): raise AssertionError("shell default used")
    def list_directory(self, sandbox, path): raise AssertionError("shell default used")
    def export_file(self, sandbox, path, dest, *, max_bytes): raise AssertionError("shell default used")
    @abc.abstractmethod
    def destroy(self, sandbox): ...

class AttachableSandboxBackend(SandboxBackend):
    @abc.abstractmethod
    def read_tags(self, sandbox): ...
    @abc.abstractmethod
    def write_tags(self, sandbox, tags): ...
    def attach(self, sandbox, *, owner, holder): raise AssertionError("read-then-write attach used")
    def release(self, sandbox, *, holder): raise AssertionError("read-then-write release used")

def is_sandbox_handle(value):
    return isinstance(value, str) and value not in ("", "None")

def dag_run_owner(context):
    return "upstream:" + context["ti"].dag_id

def encode_network_policy(spec):
    return "upstream-stamp"

def decode_network_policy(value):
    if value != "upstream-stamp":
        raise ValueError(f"{value!r} is not a network policy stamp")
    return SandboxSpec()
'''

INIT = """
from .base import (AttachableSandboxBackend, SandboxBackend, SandboxError, SandboxExecResult,
                   SandboxFileTooLargeError, SandboxSpec, SandboxTerminalError)
"""

CHECK = """
import sandbox_sidecar as s
import airflow.providers.common.ai.sandbox as up
import airflow.providers.common.ai.sandbox.base as base
assert s.UPSTREAM
for name in ("SandboxError", "SandboxTerminalError", "SandboxFileTooLargeError", "SandboxSpec",
             "SandboxExecResult", "SandboxBackend", "AttachableSandboxBackend"):
    assert getattr(s, name) is getattr(up, name), name
assert s.AttachedSandbox is base.AttachedSandbox
assert issubclass(s.SidecarSandboxBackend, up.AttachableSandboxBackend)
backend = s.SidecarSandboxBackend("/nonexistent.sock")  # every abstract method is implemented
for method in ("read_file", "write_file", "list_directory", "export_file", "attach", "release"):
    assert getattr(type(backend), method) is not getattr(up.AttachableSandboxBackend, method), method
try:
    backend.create()
except up.SandboxTerminalError as exc:
    assert exc.code == "daemon_unreachable"
else:
    raise AssertionError("no error")
err = s.to_sandbox_error(s.SidecarError("file_too_large", "x", {"size_bytes": 9, "max_bytes": 1}), path="p")
assert type(err) is up.SandboxFileTooLargeError and err.size_bytes == 9
assert isinstance(s.to_sandbox_error(s.SidecarError("bad_path", "x")), up.SandboxError)
result = s.contract.make_exec_result(exit_code=0, stdout="", stderr="", applied_timeout=5.0)
assert type(result) is up.SandboxExecResult
ours = s.contract.make_sidecar_result(exit_code=137, stdout="", stderr="", applied_timeout=1.0,
                                      reason="oom_killed", oom_killed=True, oom_kills=2)
assert isinstance(ours, up.SandboxExecResult) and issubclass(s.SidecarExecResult, up.SandboxExecResult)
assert (ours.exit_code, ours.reason, ours.oom_killed, ours.oom_kills) == (137, "oom_killed", True, 2)
try:
    ours.reason = "exited"
except AttributeError:  # dataclasses.FrozenInstanceError
    pass
else:
    raise AssertionError("frozen like upstream's")
for helper in ("dag_run_owner", "encode_network_policy", "decode_network_policy", "is_sandbox_handle"):
    assert getattr(s.contract, helper) is getattr(base, helper), helper
# upstream's decode raises on a stamp it did not write; attach must say nothing about the network then
assert s.contract.read_network_stamp("not-upstream") is None
assert s.contract.read_network_stamp("upstream-stamp") == up.SandboxSpec()
print(getattr(result, "applied_timeout", "absent"), getattr(ours, "applied_timeout", "absent"))
"""


def run_with_stub(tmp_path: Path, extra_field: str) -> str:
    package = tmp_path / "airflow" / "providers" / "common" / "ai" / "sandbox"
    package.mkdir(parents=True)
    for parent in (tmp_path / "airflow", *list(package.parents)[:4]):
        (parent / "__init__.py").touch()
    (package / "base.py").write_text(BASE.replace("{extra_field}", extra_field))
    (package / "__init__.py").write_text(INIT)
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(CHECK)],
        env={"PYTHONPATH": f"{tmp_path}:{SRC}", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def test_upstream_classes_are_used_when_the_provider_is_importable(tmp_path):
    assert run_with_stub(tmp_path, "applied_timeout: Optional[float] = None") == "5.0 1.0"


def test_an_older_provider_without_applied_timeout_still_works(tmp_path):
    assert run_with_stub(tmp_path, "") == "absent absent"
