"""The Airflow sandbox-backend contract: upstream's classes when installed, stand-ins otherwise.

With ``apache-airflow-providers-common-ai`` importable, every name here *is*
upstream's class, so the toolset's ``isinstance`` checks and ``except`` clauses
see exactly what they expect. Without it, local classes with the same names,
fields and meaning take their place, so the backend (and code written against
it) works the same way outside Airflow. ``UPSTREAM`` says which one is in use.
"""

from __future__ import annotations

import abc
import dataclasses
import json
from dataclasses import dataclass
from typing import Any, ClassVar, List, Mapping, Optional, Sequence, Tuple

OWNER_TAG = "airflow_owner"
HOLDER_TAG = "airflow_holder"
EXPIRES_AT_TAG = "airflow_expires_at"
NETWORK_TAG = "airflow_network"
WORKDIR_TAG = "airflow_workdir"

try:
    from airflow.providers.common.ai.sandbox import (  # type: ignore[import-not-found]
        SandboxBackend,
        SandboxError,
        SandboxExecResult,
        SandboxSpec,
        SandboxTerminalError,
    )

    UPSTREAM = True
except ImportError:
    UPSTREAM = False

if UPSTREAM:
    # Newer pieces of the contract, each on its own: an older provider may lack
    # them, and a local stand-in built on upstream's base classes is still right.
    try:
        from airflow.providers.common.ai.sandbox import (  # type: ignore[import-not-found]
            SandboxFileTooLargeError,
        )
    except ImportError:

        class SandboxFileTooLargeError(SandboxError):  # type: ignore[no-redef]
            """A file is larger than the caller's read budget, so it was not transferred."""

            def __init__(self, path: str, size_bytes: int, max_bytes: int) -> None:
                self.path = path
                self.size_bytes = size_bytes
                self.max_bytes = max_bytes
                super().__init__(f"{path!r} is {size_bytes} bytes, over the {max_bytes} byte read limit.")

    try:
        from airflow.providers.common.ai.sandbox import (  # type: ignore[import-not-found]
            AttachableSandboxBackend,
        )
    except ImportError:

        class AttachableSandboxBackend(SandboxBackend):  # type: ignore[no-redef]
            """A backend whose sandboxes can be found again from another process."""

    try:
        from airflow.providers.common.ai.sandbox.base import (  # type: ignore[import-not-found]
            AttachedSandbox,
        )
    except ImportError:

        @dataclass(frozen=True)
        class AttachedSandbox:  # type: ignore[no-redef]
            remaining_lifetime: Optional[float]
            network: Optional[Any]
            workdir: Optional[str]

else:

    class SandboxError(Exception):  # type: ignore[no-redef]
        """A sandbox operation failed in a way the model may work around (bad path, missing file)."""

    class SandboxTerminalError(SandboxError):  # type: ignore[no-redef]
        """The sandbox is unusable and retrying cannot help (daemon unreachable, sandbox gone, spec refused)."""

    class SandboxFileTooLargeError(SandboxError):  # type: ignore[no-redef]
        """A file is larger than the caller's read budget, so it was not transferred."""

        def __init__(self, path: str, size_bytes: int, max_bytes: int) -> None:
            self.path = path
            self.size_bytes = size_bytes
            self.max_bytes = max_bytes
            super().__init__(f"{path!r} is {size_bytes} bytes, over the {max_bytes} byte read limit.")

    @dataclass(frozen=True)
    class SandboxSpec:  # type: ignore[no-redef]
        """What one sandbox must be provisioned with; a backend refuses what it cannot enforce.

        ``owner`` names the run a later task may attach from, by convention
        ``"<dag_id>/<run_id>"``.
        """

        env: Optional[Mapping[str, str]] = None
        block_network: bool = True
        allow_egress_to: Optional[Sequence[str]] = None
        allow_egress_to_cidrs: Optional[Sequence[str]] = None
        owner: Optional[str] = None

    @dataclass(frozen=True)
    class SandboxExecResult:  # type: ignore[no-redef]
        """One command's outcome. ``timed_out`` means ``exit_code`` carries no meaning;
        ``sandbox_terminated`` means the sandbox is gone and a new one is needed;
        ``applied_timeout`` is set when the deadline used differs from the one asked for.
        """

        exit_code: int
        stdout: str
        stderr: str
        timed_out: bool = False
        stdout_truncated: bool = False
        stderr_truncated: bool = False
        sandbox_terminated: bool = False
        applied_timeout: Optional[float] = None

    @dataclass(frozen=True)
    class AttachedSandbox:  # type: ignore[no-redef]
        """What ``attach`` learned: seconds of life left, the network policy (a
        :class:`SandboxSpec` holding only the network fields) and the workdir;
        each ``None`` when unknown."""

        remaining_lifetime: Optional[float]
        network: Optional[SandboxSpec]
        workdir: Optional[str]

    class SandboxBackend(abc.ABC):  # type: ignore[no-redef]
        """Runs commands and file operations in isolated sandboxes.

        Constructors are cheap and connect lazily; ``destroy`` is idempotent;
        every method is synchronous and may be called from worker threads.
        """

        name: ClassVar[str]

        @abc.abstractmethod
        def create(self, *, spec: Optional[SandboxSpec] = None) -> str: ...

        @abc.abstractmethod
        def run_command(
            self, sandbox: str, command: str, *, timeout: float, max_output_bytes: int
        ) -> SandboxExecResult: ...

        @abc.abstractmethod
        def read_file(self, sandbox: str, path: str, *, max_bytes: int) -> bytes: ...

        @abc.abstractmethod
        def write_file(self, sandbox: str, path: str, content: bytes) -> None: ...

        @abc.abstractmethod
        def list_directory(self, sandbox: str, path: str) -> List[Tuple[str, bool]]: ...

        @abc.abstractmethod
        def destroy(self, sandbox: str) -> None: ...

    class AttachableSandboxBackend(SandboxBackend):  # type: ignore[no-redef]
        """A backend whose sandboxes outlive their creator, so a later task can attach."""

        @abc.abstractmethod
        def read_tags(self, sandbox: str) -> Mapping[str, str]: ...

        @abc.abstractmethod
        def write_tags(self, sandbox: str, tags: Mapping[str, str]) -> None: ...

        @abc.abstractmethod
        def attach(self, sandbox: str, *, owner: str, holder: str) -> AttachedSandbox: ...

        @abc.abstractmethod
        def release(self, sandbox: str, *, holder: str) -> None: ...


def make_exec_result(**fields: Any) -> SandboxExecResult:
    """Build a :class:`SandboxExecResult`, leaving out fields an older upstream does not have."""
    known = {f.name for f in dataclasses.fields(SandboxExecResult)}
    return SandboxExecResult(**{k: v for k, v in fields.items() if k in known})


# Why a command ended, as SidecarExecResult.reason says it.
REASON_EXITED = "exited"
REASON_TIMED_OUT = "timed_out"
REASON_OOM_KILLED = "oom_killed"
REASON_SANDBOX_TERMINATED = "sandbox_terminated"


@dataclass(frozen=getattr(getattr(SandboxExecResult, "__dataclass_params__", None), "frozen", True))
class SidecarExecResult(SandboxExecResult):  # type: ignore[misc,valid-type]
    """A :class:`SandboxExecResult` (upstream's when installed) that also says why the command ended.

    ``reason`` is one of ``"sandbox_terminated"``, ``"timed_out"``,
    ``"oom_killed"`` and ``"exited"``, the first that applies in that order.
    ``oom_killed`` means the kernel killed the command because the sandbox
    reached its memory limit (``exit_code`` is then 137, and ``timed_out`` is
    not set for it); ``oom_kills`` counts the sandbox's processes killed for
    memory while the command ran, including children it survived.
    """

    reason: str = REASON_EXITED
    oom_killed: bool = False
    oom_kills: int = 0


def reason_of(*, sandbox_terminated: bool, timed_out: bool, oom_killed: bool) -> str:
    """The ``reason`` the daemon gives for these flags (for a daemon too old to send one)."""
    if sandbox_terminated:
        return REASON_SANDBOX_TERMINATED
    if timed_out:
        return REASON_TIMED_OUT
    if oom_killed:
        return REASON_OOM_KILLED
    return REASON_EXITED


def make_sidecar_result(**fields: Any) -> SidecarExecResult:
    """Build a :class:`SidecarExecResult`, leaving out fields an older upstream does not have."""
    known = {f.name for f in dataclasses.fields(SidecarExecResult)}
    return SidecarExecResult(**{k: v for k, v in fields.items() if k in known})


def decode_network_policy(value: Optional[str]) -> Optional[SandboxSpec]:
    """Read an ``airflow_network`` tag back into a spec holding only the network fields.

    ``None`` when there is nothing to read or it is not what a backend writes:
    saying nothing about the network beats describing one that was never asked for.
    """
    if not value or not isinstance(value, str):
        return None
    try:
        policy = json.loads(value)
        hosts = [str(h) for h in policy["allow_egress_to"]]
        cidrs = [str(c) for c in policy["allow_egress_to_cidrs"]]
        return SandboxSpec(
            block_network=bool(policy["block_network"]),
            allow_egress_to=hosts or None,
            allow_egress_to_cidrs=cidrs or None,
        )
    except (ValueError, KeyError, TypeError):
        return None


__all__ = [
    "UPSTREAM",
    "AttachableSandboxBackend",
    "AttachedSandbox",
    "SandboxBackend",
    "SandboxError",
    "SandboxExecResult",
    "SandboxFileTooLargeError",
    "SandboxSpec",
    "SandboxTerminalError",
    "OWNER_TAG",
    "HOLDER_TAG",
    "EXPIRES_AT_TAG",
    "NETWORK_TAG",
    "WORKDIR_TAG",
    "make_exec_result",
    "make_sidecar_result",
    "reason_of",
    "SidecarExecResult",
    "REASON_EXITED",
    "REASON_TIMED_OUT",
    "REASON_OOM_KILLED",
    "REASON_SANDBOX_TERMINATED",
    "decode_network_policy",
]
