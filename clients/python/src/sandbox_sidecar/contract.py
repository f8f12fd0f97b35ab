"""The Airflow sandbox-backend contract: upstream's classes when installed, stand-ins otherwise.

With ``apache-airflow-providers-common-ai`` importable, every name here *is*
upstream's class, so the toolset's ``isinstance`` checks and ``except`` clauses
see exactly what they expect. Without it, local classes with the same names,
fields and meaning take their place, so the backend (and code written against
it) works the same way outside Airflow. ``UPSTREAM`` says which one is in use.
"""

from __future__ import annotations

import abc
import base64
import binascii
import dataclasses
import json
import math
import shlex
import time
from dataclasses import dataclass
from typing import Any, BinaryIO, ClassVar, List, Mapping, Optional, Sequence, Tuple

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

        # The file operations are concrete, as upstream's are: each is a
        # shell recipe run through run_command, so a backend that only runs
        # commands has them all. A backend with a file API of its own (this
        # package's does) overrides every one of them.

        def read_file(self, sandbox: str, path: str, *, max_bytes: int) -> bytes:
            return _shell_read_file(self, sandbox, path, max_bytes)

        def write_file(self, sandbox: str, path: str, content: bytes) -> None:
            _shell_write_file(self, sandbox, path, content)

        def list_directory(self, sandbox: str, path: str) -> List[Tuple[str, bool]]:
            return _shell_list_directory(self, sandbox, path)

        def export_file(self, sandbox: str, path: str, dest: BinaryIO, *, max_bytes: int) -> int:
            """Copy a regular file out of the sandbox into ``dest`` and return the bytes written.

            Never holds the whole file: it moves in slices. A directory, device
            or FIFO is refused; a file over ``max_bytes`` raises
            ``SandboxFileTooLargeError`` before anything is written; a file
            whose size changes during the copy raises ``SandboxError``; the
            whole copy is bounded by :func:`export_deadline`.
            """
            return _shell_export_file(self, sandbox, path, dest, max_bytes)

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


def _local_encode_network_policy(spec: SandboxSpec) -> str:
    """The ``airflow_network`` stamp of a spec: compact JSON of its three network fields, keys sorted."""
    policy = {
        "allow_egress_to": list(spec.allow_egress_to or ()),
        "allow_egress_to_cidrs": list(spec.allow_egress_to_cidrs or ()),
        "block_network": bool(spec.block_network),
    }
    return json.dumps(policy, separators=(",", ":"), sort_keys=True)


def _local_decode_network_policy(value: Optional[str]) -> Optional[SandboxSpec]:
    """A spec holding only the network fields of an ``airflow_network`` stamp.

    ``None`` for no stamp at all (``None``); ``ValueError`` for anything a
    backend of this contract does not write, the empty string included: a
    caller (``attach``) reports it and says nothing about the network, rather
    than describe one that was never asked for.
    """
    if value is None:
        return None
    try:
        policy = json.loads(value) if isinstance(value, str) else None
        hosts = policy["allow_egress_to"]  # type: ignore[index]
        cidrs = policy["allow_egress_to_cidrs"]  # type: ignore[index]
        block = policy["block_network"]  # type: ignore[index]
        if not isinstance(hosts, list) or not isinstance(cidrs, list) or not isinstance(block, bool):
            raise TypeError("wrong field types")
        return SandboxSpec(
            block_network=block,
            allow_egress_to=[str(h) for h in hosts] or None,
            allow_egress_to_cidrs=[str(c) for c in cidrs] or None,
        )
    except (ValueError, KeyError, TypeError):
        raise ValueError(f"{value!r} is not a network policy stamp") from None


def _local_dag_run_owner(context: Mapping[str, Any]) -> str:
    """``"<dag_id>/<run_id>"`` of the task context's run: the owner a toolset attaches as by default."""
    ti = context["ti"]
    return f"{ti.dag_id}/{ti.run_id}"


def _local_is_sandbox_handle(value: object) -> bool:
    """Whether ``value`` can name a sandbox: a non-empty string other than ``"None"``.

    A handle travels by XCom and templates, where a missing one turns up as
    ``None``, ``""`` or the rendered string ``"None"``.
    """
    return isinstance(value, str) and value not in ("", "None")


encode_network_policy = _local_encode_network_policy
decode_network_policy = _local_decode_network_policy
dag_run_owner = _local_dag_run_owner
is_sandbox_handle = _local_is_sandbox_handle
if UPSTREAM:
    # Upstream's own, where this provider has them; an older one lacks some.
    try:
        from airflow.providers.common.ai.sandbox import base as _upstream_base  # type: ignore[import-not-found]
    except ImportError:  # pragma: no cover - the package imported above has a base module
        _upstream_base = None
    encode_network_policy = getattr(_upstream_base, "encode_network_policy", encode_network_policy)
    decode_network_policy = getattr(_upstream_base, "decode_network_policy", decode_network_policy)
    dag_run_owner = getattr(_upstream_base, "dag_run_owner", dag_run_owner)
    is_sandbox_handle = getattr(_upstream_base, "is_sandbox_handle", is_sandbox_handle)


def read_network_stamp(value: Optional[str]) -> Optional[SandboxSpec]:
    """``decode_network_policy`` that never raises: an unreadable stamp is ``None`` (the caller logs it)."""
    if not value:
        return None
    try:
        return decode_network_policy(value)
    except ValueError:
        return None


# -- the shell recipes behind the stand-in's file operations ---------------------

FILE_OP_TIMEOUT = 120.0
"""Seconds each shell file operation may take; an export's whole copy at least this."""
_FILE_OP_OUTPUT_CAP = 1 << 20
EXPORT_SLICE_BYTES = 4 << 20
"""The bytes one slice of a shell export moves."""
EXPORT_MIN_RATE = 1 << 20
"""Bytes per second an export's deadline allows at the least: 1 GiB gets 1024 s."""

# Exit statuses the recipes reserve, beyond any a guest's command returns.
_MISSING, _DIRECTORY, _NOT_REGULAR = 66, 67, 68


def export_deadline(max_bytes: int) -> float:
    """Seconds the whole of an export may take: one byte per microsecond of budget, never under FILE_OP_TIMEOUT.

    A guest trickling a byte at a time trips no stall timeout, so only a
    deadline for the whole copy bounds it.
    """
    return max(FILE_OP_TIMEOUT, max_bytes / EXPORT_MIN_RATE)


def _checked_int(value: Any, name: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise SandboxError(f"{name} must be an integer >= 0, got {value!r}")
    return value


def _run_recipe(backend: Any, sandbox: str, script: str, *, timeout: float, cap: int) -> SandboxExecResult:
    result = backend.run_command(sandbox, script, timeout=timeout, max_output_bytes=cap)
    if result.sandbox_terminated:
        raise SandboxTerminalError(f"sandbox {sandbox!r} ended during a file operation")
    if result.timed_out:
        raise SandboxError(f"a file operation in sandbox {sandbox!r} took longer than {timeout:g} s")
    return result


def _shell_read_file(backend: Any, sandbox: str, path: str, max_bytes: int) -> bytes:
    _checked_int(max_bytes, "max_bytes")
    q = shlex.quote(path)
    # One command, the cap applied inside the guest (head -c), so a stream
    # that stat calls empty (/dev/zero, a FIFO, /proc) is bounded too.
    script = (
        f"[ -e {q} ] || exit {_MISSING}; [ -d {q} ] && exit {_DIRECTORY}; "
        f"echo \"size=$(stat -Lc %s -- {q})\"; head -c {max_bytes + 1} -- {q} | base64 -w0"
    )
    cap = 4 * (max_bytes // 3 + 2) + 256
    result = _run_recipe(backend, sandbox, script, timeout=FILE_OP_TIMEOUT, cap=cap)
    if result.exit_code == _MISSING:
        raise SandboxError(f"{path!r} does not exist in the sandbox, or cannot be read there.")
    if result.exit_code == _DIRECTORY:
        raise SandboxError(f"{path!r} is a directory; list_directory shows what it holds.")
    if result.exit_code != 0 or result.stdout_truncated:
        raise SandboxError(result.stderr.strip() or f"Could not read {path!r}.")
    head, _, encoded = result.stdout.partition("\n")
    try:
        data = base64.b64decode(encoded.strip(), validate=True)
    except (binascii.Error, ValueError):
        raise SandboxError(f"Could not decode {path!r} as the sandbox sent it.") from None
    if len(data) > max_bytes:
        size = _size_in(head) or 0
        raise SandboxFileTooLargeError(path, max(size, len(data)), max_bytes)
    return data


def _size_in(output: str) -> Optional[int]:
    """The ``size=N`` line among a recipe's output (a vendor CLI may print notices around it)."""
    for line in output.splitlines():
        if line.startswith("size="):
            try:
                return int(line[5:])
            except ValueError:
                return None
    return None


def _shell_write_file(backend: Any, sandbox: str, path: str, content: bytes) -> None:
    q = shlex.quote(path)
    payload = base64.b64encode(bytes(content)).decode("ascii")
    script = f"mkdir -p -- \"$(dirname -- {q})\" && printf %s {payload} | base64 -d > {q}"
    result = _run_recipe(backend, sandbox, script, timeout=FILE_OP_TIMEOUT, cap=_FILE_OP_OUTPUT_CAP)
    if result.exit_code != 0:
        raise SandboxError(result.stderr.strip() or f"Could not write {path!r}.")


def _shell_list_directory(backend: Any, sandbox: str, path: str) -> List[Tuple[str, bool]]:
    q = shlex.quote(path)
    # NUL ends each record and '/' (never in a name) ends the type letter, so
    # a name holding a newline or a space comes back whole.
    script = f"find {q} -mindepth 1 -maxdepth 1 -printf '%y/%f\\0'"
    result = _run_recipe(backend, sandbox, script, timeout=FILE_OP_TIMEOUT, cap=_FILE_OP_OUTPUT_CAP)
    if result.exit_code != 0 or result.stdout_truncated:
        raise SandboxError(result.stderr.strip() or f"Could not list {path!r}.")
    entries: List[Tuple[str, bool]] = []
    for record in result.stdout.split("\0"):
        kind, sep, name = record.partition("/")
        if sep and name:
            entries.append((name, kind == "d"))
    return entries


def _shell_export_file(backend: Any, sandbox: str, path: str, dest: BinaryIO, max_bytes: int) -> int:
    _checked_int(max_bytes, "max_bytes")
    q = shlex.quote(path)
    deadline = time.monotonic() + export_deadline(max_bytes)
    probe = (
        f"[ -e {q} ] || exit {_MISSING}; [ -d {q} ] && exit {_DIRECTORY}; [ -f {q} ] || exit {_NOT_REGULAR}; "
        f"echo \"size=$(stat -Lc %s -- {q})\""
    )

    def size_now() -> int:
        result = _run_recipe(backend, sandbox, probe, timeout=FILE_OP_TIMEOUT, cap=_FILE_OP_OUTPUT_CAP)
        if result.exit_code == _MISSING:
            raise SandboxError(f"{path!r} does not exist in the sandbox, or cannot be read there.")
        if result.exit_code == _DIRECTORY:
            raise SandboxError(f"{path!r} is a directory; only a regular file can be exported.")
        if result.exit_code == _NOT_REGULAR:
            raise SandboxError(f"{path!r} is not a regular file (a device, FIFO or socket); it cannot be exported.")
        size = _size_in(result.stdout) if result.exit_code == 0 else None
        if size is None:
            raise SandboxError(result.stderr.strip() or f"Could not export {path!r}: its size is unknown.")
        return size

    size = size_now()
    if size > max_bytes:
        raise SandboxFileTooLargeError(path, size, max_bytes)
    written = 0
    while written < size:
        if time.monotonic() > deadline:
            raise SandboxError(f"exporting {path!r} took longer than {export_deadline(max_bytes):g} s; it was stopped.")
        want = min(EXPORT_SLICE_BYTES, size - written)
        script = f"dd if={q} bs=64K iflag=skip_bytes,count_bytes skip={written} count={want} status=none | base64 -w0"
        cap = 4 * (want // 3 + 2) + 256
        remaining = max(1.0, min(FILE_OP_TIMEOUT, deadline - time.monotonic()))
        result = _run_recipe(backend, sandbox, script, timeout=remaining, cap=cap)
        if result.exit_code != 0 or result.stdout_truncated:
            raise SandboxError(result.stderr.strip() or f"Could not export {path!r}: a slice failed.")
        try:
            data = base64.b64decode(result.stdout.strip(), validate=True)
        except (binascii.Error, ValueError):
            raise SandboxError(f"Could not export {path!r}: a slice did not decode.") from None
        if len(data) != want:
            raise SandboxError(f"{path!r} changed while it was exported (a slice came back short).")
        dest.write(data)
        written += want
    after = size_now()
    if after != size:
        if after > max_bytes:
            raise SandboxFileTooLargeError(path, after, max_bytes)
        raise SandboxError(f"{path!r} changed while it was exported ({size} bytes, then {after}).")
    return written


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
    "encode_network_policy",
    "dag_run_owner",
    "is_sandbox_handle",
    "read_network_stamp",
    "export_deadline",
    "FILE_OP_TIMEOUT",
    "EXPORT_MIN_RATE",
]
