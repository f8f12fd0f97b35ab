"""``SidecarSandboxBackend``: Airflow's sandbox backend, served by the sandbox-sidecar daemon."""

from __future__ import annotations

import logging
import math
import threading
import time
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from .client import SidecarClient, check_timeouts, resolve_socket_path
from .contract import (
    HOLDER_TAG,
    AttachableSandboxBackend,
    AttachedSandbox,
    SandboxError,
    SandboxExecResult,
    SandboxFileTooLargeError,
    SandboxSpec,
    SandboxTerminalError,
    SidecarExecResult,
    export_deadline,
    make_sidecar_result,
    read_network_stamp,
    reason_of,
)
from .code import (
    DEFAULT_CONTEXT,
    SidecarCodeResult,
    SidecarContextInfo,
    code_result_from_wire,
    context_info_from_wire,
)
from .processes import (
    SIGNALS,
    STREAMS,
    OutputFollower,
    SidecarOutput,
    SidecarProcess,
    SidecarProcessInfo,
    output_from_wire,
    process_from_wire,
    process_info_from_wire,
)
from .errors import (
    CLIENT_CLOSED,
    CLIENT_TIMEOUT,
    CONNECTION_LOST,
    DAEMON_UNREACHABLE,
    PROTOCOL_ERROR,
    SidecarError,
    SidecarTimeoutError,
)

log = logging.getLogger(__name__)

__all__ = [
    "SidecarSandboxBackend",
    "HOST_SEPARATOR",
    "split_handle",
    "ERROR_KINDS",
    "MODEL",
    "TERMINAL",
    "to_sandbox_error",
    "labels_from_context",
    "check_resources",
    "RESOURCE_KEYS",
]

MODEL = "model"
"""Raised as ``SandboxError``: the toolset hands the message to the model, which can fix its call."""
TERMINAL = "terminal"
"""Raised as ``SandboxTerminalError``: the task fails and Airflow's own retry takes over."""

# What each error code means to an agent run. docs/airflow.md renders this table
# for people; keep the two in step.
ERROR_KINDS: Mapping[str, Tuple[str, str]] = {
    # The model asked for something it can correct.
    "bad_request": (MODEL, "a command or argument is malformed; the message names it"),
    "bad_path": (MODEL, "the path is empty or contains NUL, a write leaves the workdir and /tmp, the guest may not open the file, or it is a FIFO or socket"),
    "path_not_found": (MODEL, "nothing exists at that path"),
    "is_a_directory": (MODEL, "a file was expected, the path is a directory"),
    "not_a_directory": (MODEL, "a directory was expected, the path is a file"),
    "too_many_entries": (MODEL, "the directory has more entries than the daemon lists at once"),
    "file_too_large": (MODEL, "the file is over the read (or write) limit; raised as SandboxFileTooLargeError"),
    "process_not_found": (MODEL, "no such durable process in that sandbox (never started there, or its record was dropped)"),
    "process_ended": (MODEL, "signal_process: the process has ended; there is nothing to signal"),
    "context_not_found": (MODEL, "restart_context, delete_context: no such code context in that sandbox"),
    "context_busy": (MODEL, "run_code: the context still runs an earlier cell (one whose caller went away runs to its timeout)"),
    # Nothing the model does can help: the task fails, Airflow retries it.
    "not_found": (TERMINAL, "the sandbox is gone (destroyed, expired, idle too long, or another user's)"),
    "unauthorized": (TERMINAL, "the worker's user may not use the daemon (socket group membership)"),
    "spec_unenforceable": (TERMINAL, "this host cannot guarantee the SandboxSpec or resources (e.g. allow_egress_to)"),
    "quota_exceeded": (TERMINAL, "too many sandboxes or commands on this host, user or run"),
    "busy": (TERMINAL, "the daemon has too many connections, or a pause met a sandbox running a command"),
    "backend_unavailable": (TERMINAL, "the isolation backend cannot work on this host right now"),
    "backend_error": (TERMINAL, "the isolation backend failed"),
    "shutting_down": (TERMINAL, "the daemon is stopping or restarting"),
    "internal": (TERMINAL, "a daemon bug or unexpected host failure; see the daemon's log"),
    "owner_mismatch": (TERMINAL, "attach: the sandbox belongs to another DAG run"),
    "held_by_other": (TERMINAL, "attach: another task holds the sandbox"),
    "wrong_host": (TERMINAL, "the handle names another host: the sandbox lives there"),
    "image_not_found": (TERMINAL, "the image the backend was made with is not on this host (the operator imports it)"),
    "no_shell": (TERMINAL, "the sandbox's image has no /bin/sh to run a command string (Airflow sends strings): give the image a shell"),
    "no_python": (TERMINAL, "run_code: the sandbox's image has no python3: create the sandbox from an image with one"),
    "image_in_use": (TERMINAL, "image_rm: sandboxes or the warm pool run on the image"),
    "image_exists": (TERMINAL, "an import's name is taken by another image"),
    "bad_image": (TERMINAL, "an import is not an image, or a hostile one"),
    "image_too_large": (TERMINAL, "an import exceeds the daemon's image caps"),
    "not_supported": (TERMINAL, "the daemon's backend cannot do this at all (durable processes, code contexts, snapshots and forks on sbx, with memory but on gVisor; pause where the host cannot freeze)"),
    "no_space": (TERMINAL, "the host's disk filled up during a snapshot or a fork; nothing was kept"),
    "frame_too_large": (TERMINAL, "a request or response exceeded the frame limit"),
    "unsupported_version": (TERMINAL, "client and daemon share no protocol version"),
    "unknown_op": (TERMINAL, "the daemon is too old for this operation"),
    "too_many_requests": (TERMINAL, "the daemon refused more concurrent requests"),
    # Produced by the client itself.
    DAEMON_UNREACHABLE: (TERMINAL, "no daemon at the socket, or permission denied on it"),
    CONNECTION_LOST: (TERMINAL, "the connection broke and the call could not safely be retried"),
    CLIENT_TIMEOUT: (TERMINAL, "the daemon did not answer within the call's timeout plus a grace"),
    PROTOCOL_ERROR: (TERMINAL, "the daemon sent something that is not a valid frame"),
    CLIENT_CLOSED: (TERMINAL, "the backend was closed"),
}
"""Error code -> (``MODEL`` or ``TERMINAL``, what it means). Codes not listed are terminal."""

_AIRFLOW_LABELS = ("dag_id", "run_id", "task_id", "try_number", "map_index")
_MAX_LABEL_VALUE_BYTES = 256
# Requested and applied timeouts closer than this are the same deadline.
_TIMEOUT_EPSILON = 1e-3


def to_sandbox_error(error: SidecarError, *, op: str = "", path: Optional[str] = None) -> SandboxError:
    """The Airflow exception for a client error, following :data:`ERROR_KINDS`.

    Every failure of ``create`` is terminal: the model has no say in
    provisioning. The result carries ``code``, ``details`` and
    ``sidecar_error`` attributes for programs that want them.
    """
    if error.code == "file_too_large":
        size = error.details.get("size_bytes")
        limit = error.details.get("max_bytes")
        exc: SandboxError = SandboxFileTooLargeError(
            path if path is not None else "",
            size if isinstance(size, int) else -1,
            limit if isinstance(limit, int) else -1,
        )
    else:
        kind = ERROR_KINDS.get(error.code, (TERMINAL, ""))[0]
        if op == "create":
            kind = TERMINAL
        cls = SandboxError if kind == MODEL else SandboxTerminalError
        exc = cls(error.message or error.code)
    exc.code = error.code  # type: ignore[attr-defined]
    exc.details = dict(error.details)  # type: ignore[attr-defined]
    exc.sidecar_error = error  # type: ignore[attr-defined]
    return exc


def labels_from_context(context: Mapping[str, Any]) -> Dict[str, str]:
    """``dag_id``, ``run_id``, ``task_id``, ``try_number``, ``map_index`` of a task context, as labels."""
    ti = context.get("ti") or context.get("task_instance")
    labels: Dict[str, str] = {}
    for key in _AIRFLOW_LABELS:
        value = getattr(ti, key, None) if ti is not None else None
        if value is None:
            value = context.get(key)
        if value is not None:
            labels[key] = _clip_utf8(str(value), _MAX_LABEL_VALUE_BYTES)
    return labels


def _clip_utf8(value: str, limit: int) -> str:
    data = value.encode("utf-8", "surrogatepass")
    if len(data) <= limit:
        return value
    return data[:limit].decode("utf-8", "ignore")


_context_getter: Optional[Callable[[], Mapping[str, Any]]] = None
_context_getter_searched = False


def _airflow_task_labels() -> Dict[str, str]:
    """Labels of the Airflow task running in this thread, or nothing outside one."""
    global _context_getter, _context_getter_searched
    if not _context_getter_searched:
        for module in ("airflow.sdk", "airflow.operators.python"):
            try:
                _context_getter = getattr(__import__(module, fromlist=["get_current_context"]), "get_current_context")
                break
            except Exception:  # not installed, or an Airflow that fails to import here
                continue
        _context_getter_searched = True
    if _context_getter is None:
        return {}
    try:
        return labels_from_context(_context_getter())
    except Exception:  # not inside a task: no context to attribute to
        return {}


def _positive_finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0


# The longest wait_process (and read_output wait) the daemon makes at once.
_MAX_PROCESS_WAIT_S = 600.0


def _check_process_args(process: Any, stream: str = "stdout", offset: int = 0) -> None:
    """``SandboxError`` for a process id, stream or offset the daemon would refuse."""
    if not isinstance(process, str) or not process:
        raise SandboxError(f"process must be a process id (a non-empty str), got {process!r}")
    if stream not in STREAMS:
        raise SandboxError(f"stream must be one of {', '.join(STREAMS)}, got {stream!r}")
    if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
        raise SandboxError(f"offset must be an integer >= 0, got {offset!r}")


def _text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).decode("utf-8", errors="replace")
    return str(value)


def _name(value: Any) -> str:
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", errors="surrogateescape")
    return str(value)


RESOURCE_KEYS = ("memory_bytes", "cpus", "pids", "disk_bytes")
"""The keys of ``create``'s ``resources``: bytes of memory, CPUs, processes and threads, bytes of disk."""


def check_resources(resources: Optional[Mapping[str, Any]]) -> Dict[str, Any]:
    """``resources`` as the daemon takes them, or ``ValueError`` saying what to fix.

    Keys are :data:`RESOURCE_KEYS`; ``cpus`` is a number, the others integers,
    all greater than 0. A ``None`` value is left out (the daemon's default).
    Whether the daemon allows and can enforce them is for the daemon to say.
    """
    if resources is None:
        return {}
    if not isinstance(resources, Mapping):
        raise ValueError(f"resources must be a mapping of {', '.join(RESOURCE_KEYS)}, got {type(resources).__name__}")
    out: Dict[str, Any] = {}
    for key, value in resources.items():
        if key not in RESOURCE_KEYS:
            raise ValueError(f"unknown resources key {key!r}; the keys are {', '.join(RESOURCE_KEYS)}")
        if value is None:
            continue
        if key == "cpus":
            if not _positive_finite(value):
                raise ValueError(f"resources['cpus'] must be a positive finite number of CPUs, got {value!r}")
            out[key] = value
        else:
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"resources[{key!r}] must be an integer greater than 0, got {value!r}")
            out[key] = value
    return out


def spec_to_wire(spec: SandboxSpec) -> Dict[str, Any]:
    """The ``create`` spec map for a :class:`SandboxSpec`.

    ``block_network`` is always sent: a spec given at all is a request, and its
    default (``True``) is a requirement. Empty egress lists are left out, since
    with nothing to allow they ask for nothing beyond ``block_network``.
    """
    wire: Dict[str, Any] = {"block_network": bool(spec.block_network)}
    if spec.env is not None:
        wire["env"] = dict(spec.env)
    if spec.allow_egress_to:
        wire["allow_egress_to"] = list(spec.allow_egress_to)
    if spec.allow_egress_to_cidrs:
        wire["allow_egress_to_cidrs"] = list(spec.allow_egress_to_cidrs)
    if spec.owner is not None:
        wire["owner"] = spec.owner
    return wire


def _attach_refusal(error: SidecarError, handle: str, owner: str, holder: str, backend_name: str) -> SandboxError:
    """``attach``'s error for ``error``, worded as upstream words its refusals.

    An operator reading a task log sees the same sentence whichever backend
    ran: a sandbox that carries no owner (a bare handle is never enough), the
    owner it carries, or who holds it.
    """
    exc = to_sandbox_error(error, op="attach")
    if error.code == "owner_mismatch":
        actual = error.details.get("owner")
        carried = f"it carries owner {actual!r}" if actual else "it carries no owner"
        message = (
            f"Sandbox {handle!r} on backend {backend_name!r} is not owned by {owner!r}: {carried}. "
            "Only the owner a sandbox was provisioned for may attach to it: provision it with "
            "SandboxSpec(owner=dag_run_owner(context)) in the DAG run that attaches, or give the "
            "toolset the owner the provisioning task used."
        )
    elif error.code == "held_by_other":
        message = (
            f"Sandbox {handle!r} is already held by {error.details.get('holder')!r}, and {holder!r} cannot "
            "share it: one agent run uses a sandbox at a time. Provision a sandbox per task that needs "
            "its own workspace, or run the tasks one after another."
        )
    else:
        return exc
    refusal = SandboxTerminalError(message)
    refusal.code = exc.code  # type: ignore[attr-defined]
    refusal.details = exc.details  # type: ignore[attr-defined]
    refusal.sidecar_error = error  # type: ignore[attr-defined]
    return refusal


output_log = logging.getLogger("sandbox_sidecar.output")


class _OutputLogger:
    """An ``on_output`` that logs whole lines (at most 64 KiB kept of one unfinished line)."""

    def __init__(self, sandbox: str) -> None:
        self.sandbox = sandbox
        self.partial = {"stdout": b"", "stderr": b""}

    def __call__(self, stream: str, data: bytes) -> None:
        buf = self.partial.get(stream, b"") + data
        *lines, rest = buf.split(b"\n")
        for line in lines:
            output_log.info("[%s %s] %s", self.sandbox, stream, line.decode("utf-8", "replace"))
        self.partial[stream] = rest[-(64 << 10):]

    def flush(self) -> None:
        for stream, rest in self.partial.items():
            if rest:
                output_log.info("[%s %s] %s", self.sandbox, stream, rest.decode("utf-8", "replace"))
        self.partial = {"stdout": b"", "stderr": b""}


HOST_SEPARATOR = "@"
"""Between a sandbox's id and the host it lives on in a handle: ``"sc-1a2b...@worker-3"``."""


def split_handle(handle: str) -> Tuple[str, Optional[str]]:
    """``(sandbox id, host)`` of a handle; the host is ``None`` for a bare id (from the CLI or an older client)."""
    sandbox, sep, host = handle.rpartition(HOST_SEPARATOR)
    if not sep or not sandbox or not host:
        return handle, None
    return sandbox, host


class SidecarSandboxBackend(AttachableSandboxBackend):
    """Runs an Airflow agent's sandbox in the host's sandbox-sidecar daemon.

    Cheap to construct (it runs at DAG-parse time): nothing connects until the
    first call. One instance holds one connection, shared safely by the
    toolset's worker threads. Sandboxes created without an owner or a ttl are
    bound to that connection, so the daemon reclaims them if the worker dies.

    A handle is ``"<sandbox id>@<host>"``, the host as the daemon names it
    (``server.node_name``; on Kubernetes the node). A sandbox never leaves its
    host, so a handle used from a task on another host fails with a
    ``SandboxTerminalError`` (code ``wrong_host``) naming the host it lives on,
    instead of a bare "not found". A bare id is accepted as it is.

    :param socket_path: the daemon's socket; default ``$SANDBOX_SIDECAR_SOCKET``
        or ``/run/sandbox-sidecar/sidecar.sock``.
    :param labels: attribution sent with every ``create`` (the daemon's ``list``
        shows them), e.g. ``{"dag_id": ...}``; values are turned into strings.
    :param ttl_s: ask for expiring sandboxes living this long instead of
        connection-bound ones (a spec with an ``owner`` is always expiring).
    :param auto_labels: inside a running Airflow task, add its ``dag_id``,
        ``run_id``, ``task_id``, ``try_number`` and ``map_index`` as labels.
    :param resources: limits tighter than the daemon's for every sandbox this
        backend creates (Airflow's ``SandboxSpec`` has no resource fields):
        ``memory_bytes``, ``cpus``, ``pids``, ``disk_bytes``. A limit the host
        cannot enforce, or looser than the daemon allows, fails ``create``.
    :param image: the image every sandbox this backend creates runs on: a
        name the operator imported (``sandbox-sidecar image ls``), or
        ``"host"``; ``None`` takes the daemon's default. The image brings the
        sandbox's libraries (numpy, pandas, ...) without touching the host.
        An image this host does not have fails ``create`` with a
        ``SandboxTerminalError`` (code ``image_not_found``) listing those it has.
    :param connect_timeout: seconds to connect to the daemon.
    :param op_timeout: budget of the calls with no timeout of their own.
    :param grace: seconds allowed beyond a call's budget before giving up on
        the daemon; a command whose answer does not come by then has its
        sandbox destroyed and reports ``sandbox_terminated``.
    :param client: an existing :class:`SidecarClient` to use instead.
    :param log_output: stream every command's output, line by line, to the
        ``sandbox_sidecar.output`` logger (INFO) while it runs: inside a task,
        the task log shows a long command's progress as it happens.
    """

    name = "sidecar"

    def __init__(
        self,
        socket_path: Optional[str] = None,
        *,
        labels: Optional[Mapping[str, Any]] = None,
        ttl_s: Optional[float] = None,
        auto_labels: bool = True,
        resources: Optional[Mapping[str, Any]] = None,
        image: Optional[str] = None,
        connect_timeout: float = 5.0,
        op_timeout: float = 60.0,
        grace: float = 15.0,
        client: Optional[SidecarClient] = None,
        log_output: bool = False,
    ) -> None:
        if ttl_s is not None and not _positive_finite(ttl_s):
            raise ValueError(f"ttl_s must be a positive finite number of seconds, got {ttl_s!r}")
        self._socket_path = socket_path
        self._labels = {str(k): str(v) for k, v in (labels or {}).items() if v is not None}
        self._ttl_s = ttl_s
        self._auto_labels = auto_labels
        self._log_output = bool(log_output)
        self._resources = check_resources(resources)
        if image is not None and (not isinstance(image, str) or not image):
            raise ValueError(f"image must be an image's name (a non-empty str) or None, got {image!r}")
        self._image = image
        self._client_options = {"connect_timeout": connect_timeout, "op_timeout": op_timeout, "grace": grace}
        check_timeouts(**self._client_options)
        self._client = client
        self._injected_client = client is not None
        self._client_lock = threading.Lock()
        self._command_locks_lock = threading.Lock()
        # The daemon runs one command per sandbox at a time and queues the
        # rest, so a command's deadline would otherwise include the time spent
        # behind its siblings. Queuing them here instead starts each deadline
        # when its command can actually run.
        self._command_locks: Dict[str, threading.Lock] = {}

    def __repr__(self) -> str:
        path = self._client.socket_path if self._client is not None else resolve_socket_path(self._socket_path)
        return f"{type(self).__name__}({path!r})"

    # Copies and pickles (Airflow makes both) start unconnected.
    def __getstate__(self) -> dict:
        return {
            "socket_path": self._client.socket_path if self._injected_client else self._socket_path,
            "labels": dict(self._labels),
            "ttl_s": self._ttl_s,
            "auto_labels": self._auto_labels,
            "log_output": self._log_output,
            "resources": dict(self._resources),
            "image": self._image,
            **self._client_options,
        }

    def __setstate__(self, state: dict) -> None:
        state = dict(state)
        self.__init__(state.pop("socket_path"), **state)  # type: ignore[misc]

    @property
    def client(self) -> SidecarClient:
        """The plain client under this backend (created on first use)."""
        if self._client is None:
            with self._client_lock:
                if self._client is None:
                    self._client = SidecarClient(self._socket_path, **self._client_options)
        return self._client

    def close(self) -> None:
        """Close the connection; connection-bound sandboxes end after the daemon's grace."""
        if self._client is not None:
            self._client.close()

    def __enter__(self) -> "SidecarSandboxBackend":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    # -- lifecycle ---------------------------------------------------------------

    def create(
        self,
        *,
        spec: Optional[SandboxSpec] = None,
        labels: Optional[Mapping[str, Any]] = None,
        ttl_s: Optional[float] = None,
        resources: Optional[Mapping[str, Any]] = None,
        image: Optional[str] = None,
    ) -> str:
        """Provision a sandbox and return its id.

        A spec (or resources) this host cannot enforce raises
        ``SandboxTerminalError`` with the daemon's explanation; nothing weaker
        is ever provisioned. ``labels``, ``ttl_s`` and ``resources`` add to
        (and override) the constructor's, key by key; ``image`` overrides the
        constructor's.
        """
        merged: Dict[str, str] = _airflow_task_labels() if self._auto_labels else {}
        merged.update(self._labels)
        merged.update({str(k): str(v) for k, v in (labels or {}).items() if v is not None})
        limits = {**self._resources, **check_resources(resources)}
        try:
            result = self.client.create(
                spec_to_wire(spec) if spec is not None else None,
                labels=merged or None,
                ttl_s=ttl_s if ttl_s is not None else self._ttl_s,
                resources=limits or None,
                image=image if image is not None else self._image,
            )
        except SidecarError as exc:
            raise to_sandbox_error(exc, op="create") from exc
        sandbox = result.get("sandbox")
        if not isinstance(sandbox, str) or not sandbox:
            raise SandboxTerminalError("the sandbox-sidecar daemon answered create without a sandbox id")
        host = self._host()
        return f"{sandbox}{HOST_SEPARATOR}{host}" if host else sandbox

    def _host(self) -> Optional[str]:
        """The host the daemon names itself (hello's ``node``); ``None`` from a daemon too old to say."""
        try:
            node = self.client.hello().get("node")
        except SidecarError as exc:
            raise to_sandbox_error(exc) from exc
        return node if isinstance(node, str) and node else None

    def sandbox_id(self, handle: str) -> str:
        """The daemon's id of the sandbox behind ``handle``, for :attr:`client` calls.

        ``SandboxTerminalError`` (code ``wrong_host``) when the handle names
        another host than this daemon's: the sandbox lives there, and only
        that host's daemon can reach it.
        """
        if not isinstance(handle, str):
            return handle
        sandbox, host = split_handle(handle)
        if host is None:
            return handle
        here = self._host()
        if here is not None and host != here:
            exc = SandboxTerminalError(
                f"sandbox {sandbox} lives on host {host!r}, and this task runs on {here!r}: a sandbox never "
                "leaves the host that made it. Keep the tasks of one DAG run on one host (a Celery queue per "
                "host, or node affinity on Kubernetes; see docs/airflow.md)."
            )
            exc.code = "wrong_host"  # type: ignore[attr-defined]
            exc.details = {"host": host, "this_host": here}  # type: ignore[attr-defined]
            exc.sidecar_error = None  # type: ignore[attr-defined]
            raise exc
        return sandbox

    def destroy(self, sandbox: str) -> None:
        """Destroy the sandbox; one that is already gone is not an error."""
        if not isinstance(sandbox, str) or not sandbox:
            return
        sandbox = self.sandbox_id(sandbox)
        try:
            self.client.destroy(sandbox)
        except SidecarError as exc:
            raise to_sandbox_error(exc, op="destroy") from exc
        with self._command_locks_lock:
            self._command_locks.pop(sandbox, None)

    def renew(self, sandbox: str, ttl_s: float) -> float:
        """Extend an expiring sandbox to now + ``ttl_s`` (capped); returns the seconds left."""
        sandbox = self.sandbox_id(sandbox)
        try:
            result = self.client.renew(sandbox, ttl_s)
        except SidecarError as exc:
            raise to_sandbox_error(exc, op="renew") from exc
        return float(result.get("remaining_s") or 0.0)

    def destroy_run(self, owner: str) -> List[str]:
        """Destroy every sandbox owned by ``owner`` (e.g. at the end of a DAG run); returns their ids."""
        try:
            return self.client.destroy_run(owner)
        except SidecarError as exc:
            raise to_sandbox_error(exc, op="destroy_run") from exc

    # -- commands and files ------------------------------------------------------

    def run_command(
        self,
        sandbox: str,
        command: str,
        *,
        timeout: float,
        max_output_bytes: int,
        on_output: Optional[Callable[[str, bytes], None]] = None,
    ) -> SidecarExecResult:
        """Run ``command`` with ``sh -c``; a :class:`SidecarExecResult` (a ``SandboxExecResult``).

        Besides upstream's fields it carries ``reason``, ``oom_killed`` and
        ``oom_kills``: a command the kernel killed for the sandbox's memory
        limit comes back with ``exit_code`` 137, ``oom_killed=True`` and
        ``reason="oom_killed"``, not ``timed_out``.
        """
        if not isinstance(command, str):
            raise SandboxError(f"command must be a shell command string, got {type(command).__name__}")
        if not _positive_finite(timeout):
            raise SandboxError(f"timeout must be a positive number of seconds, got {timeout!r}")
        if not isinstance(max_output_bytes, int) or isinstance(max_output_bytes, bool) or max_output_bytes < 0:
            raise SandboxError(f"max_output_bytes must be an integer >= 0, got {max_output_bytes!r}")
        sandbox = self.sandbox_id(sandbox)
        try:
            with self._command_lock(sandbox):
                if on_output is None and self._log_output:
                    on_output = _OutputLogger(sandbox)
                result = self.client.run_command(
                    sandbox, command, timeout_s=float(timeout), max_output_bytes=max_output_bytes, on_output=on_output
                )
                if isinstance(on_output, _OutputLogger):
                    on_output.flush()
        except SidecarTimeoutError:
            # The daemon did not answer within the budget plus a grace. The only
            # sure way to stop the command is to end its sandbox.
            self._destroy_quietly(sandbox)
            return make_sidecar_result(
                exit_code=-1,
                stdout="",
                stderr="the sandbox-sidecar daemon did not answer in time; the sandbox was destroyed",
                timed_out=True,
                sandbox_terminated=True,
                reason=reason_of(sandbox_terminated=True, timed_out=True, oom_killed=False),
            )
        except SidecarError as exc:
            raise to_sandbox_error(exc, op="run_command") from exc
        applied = result.get("applied_timeout_s")
        applied_timeout = None
        if _positive_finite(applied) and abs(float(applied) - float(timeout)) > _TIMEOUT_EPSILON:
            applied_timeout = float(applied)
        exit_code = result.get("exit_code")
        timed_out = bool(result.get("timed_out"))
        sandbox_terminated = bool(result.get("sandbox_terminated"))
        oom_killed = bool(result.get("oom_killed"))
        oom_kills = result.get("oom_kills")
        reason = result.get("reason")
        if not isinstance(reason, str) or not reason:
            reason = reason_of(sandbox_terminated=sandbox_terminated, timed_out=timed_out, oom_killed=oom_killed)
        return make_sidecar_result(
            exit_code=exit_code if isinstance(exit_code, int) else -1,
            stdout=_text(result.get("stdout")),
            stderr=_text(result.get("stderr")),
            timed_out=timed_out,
            stdout_truncated=bool(result.get("stdout_truncated")),
            stderr_truncated=bool(result.get("stderr_truncated")),
            sandbox_terminated=sandbox_terminated,
            applied_timeout=applied_timeout,
            reason=reason,
            oom_killed=oom_killed,
            oom_kills=oom_kills if isinstance(oom_kills, int) and not isinstance(oom_kills, bool) and oom_kills >= 0 else 0,
        )

    def _command_lock(self, sandbox: str) -> threading.Lock:
        with self._command_locks_lock:
            return self._command_locks.setdefault(sandbox, threading.Lock())

    def _destroy_quietly(self, sandbox: str) -> None:
        try:
            self.client.destroy(sandbox)
        except SidecarError:
            pass  # the daemon is not answering; it reclaims the sandbox itself

    def read_file(self, sandbox: str, path: str, *, max_bytes: int) -> bytes:
        """The file's bytes; ``SandboxFileTooLargeError`` (with the real size) when over ``max_bytes``."""
        if not isinstance(path, str):
            raise SandboxError(f"path must be a string, got {type(path).__name__}")
        if not isinstance(max_bytes, int) or isinstance(max_bytes, bool) or max_bytes < 0:
            raise SandboxError(f"max_bytes must be an integer >= 0, got {max_bytes!r}")
        sandbox = self.sandbox_id(sandbox)
        try:
            result = self.client.read_file(sandbox, path, max_bytes=max_bytes)
        except SidecarError as exc:
            raise to_sandbox_error(exc, op="read_file", path=path) from exc
        data = result.get("data")
        if isinstance(data, str):
            data = data.encode("utf-8", "surrogateescape")
        if not isinstance(data, (bytes, bytearray)):
            raise SandboxTerminalError("the sandbox-sidecar daemon answered read_file without data")
        if len(data) > max_bytes:  # a daemon should never do this; the caller's budget still holds
            raise SandboxFileTooLargeError(path, len(data), max_bytes)
        return bytes(data)

    def write_file(self, sandbox: str, path: str, content: bytes) -> None:
        """Write ``content`` (creating parent directories), replacing any existing file.

        Content that fits one request goes in one, so no reader in the
        sandbox ever sees half of it. Larger content (past the daemon's
        per-write limit or a frame) goes in pieces of :attr:`piece_bytes`: the
        first replaces the file, the rest are written at their offsets.
        """
        if not isinstance(path, str):
            raise SandboxError(f"path must be a string, got {type(path).__name__}")
        if isinstance(content, str):
            content = content.encode("utf-8")
        if not isinstance(content, (bytes, bytearray, memoryview)):
            raise SandboxError(f"content must be bytes, got {type(content).__name__}")
        sandbox = self.sandbox_id(sandbox)
        view = memoryview(bytes(content) if not isinstance(content, bytes) else content)
        try:
            one = self._one_request_bytes()
            if len(view) <= one:
                self.client.write_file(sandbox, path, view)
                return
            piece = min(self.piece_bytes, one)
            self.client.write_file(sandbox, path, view[:piece])
            for offset in range(piece, len(view), piece):
                self.client.write_file(sandbox, path, view[offset : offset + piece], offset=offset)
        except SidecarError as exc:
            raise to_sandbox_error(exc, op="write_file", path=path) from exc

    piece_bytes = 1 << 20
    """Bytes one request of :meth:`export_file` or of a large :meth:`write_file` moves.

    Small enough that the daemon's memory stays small (each piece is garbage
    it collects) and that other calls sharing the connection do not wait long
    behind a piece."""

    def _one_request_bytes(self) -> int:
        """The most file bytes one write_file request may carry: the daemon's limit, within a frame."""
        limits = self.client.limits
        per_write = limits.get("max_file_bytes")
        frame = limits.get("max_frame_bytes")
        one = per_write if isinstance(per_write, int) and per_write > 0 else self.piece_bytes
        if isinstance(frame, int) and frame > 0:
            one = min(one, frame - 64 * 1024)  # room for the envelope and the path
        return max(one, 1)

    def export_file(self, sandbox: str, path: str, dest: Any, *, max_bytes: int) -> int:
        """Copy the regular file at ``path`` into ``dest`` (a writable binary stream); return the bytes written.

        Native: ranged reads of :attr:`piece_bytes`, one piece in memory at a
        time, whatever the file's size. A directory, device or FIFO is refused
        (``SandboxError``); a file larger than ``max_bytes`` raises
        ``SandboxFileTooLargeError`` before anything is written; a file whose
        size changes during the copy raises ``SandboxError`` (or
        ``SandboxFileTooLargeError`` when it grew past ``max_bytes``). The whole
        copy is bounded by a deadline growing with ``max_bytes`` (at least
        1 MiB/s, never under two minutes), each request by what is left of it.
        """
        if not isinstance(path, str):
            raise SandboxError(f"path must be a string, got {type(path).__name__}")
        if not isinstance(max_bytes, int) or isinstance(max_bytes, bool) or max_bytes < 0:
            raise SandboxError(f"max_bytes must be an integer >= 0, got {max_bytes!r}")
        if not callable(getattr(dest, "write", None)):
            raise SandboxError(f"dest must be a writable binary stream, got {type(dest).__name__}")
        sandbox = self.sandbox_id(sandbox)
        allowed = export_deadline(max_bytes)
        deadline = time.monotonic() + allowed

        def piece(offset: int, length: int) -> Tuple[bytes, int]:
            left = deadline - time.monotonic()
            if left <= 0:
                raise SandboxError(f"exporting {path!r} took longer than {allowed:g} s, its deadline for {max_bytes} bytes; it was stopped")
            try:
                result = self.client.read_file_range(
                    sandbox, path, offset=offset, length=length, timeout=min(left, self.client.op_timeout)
                )
            except SidecarTimeoutError as exc:
                raise SandboxError(f"exporting {path!r} took longer than {allowed:g} s; it was stopped") from exc
            except SidecarError as exc:
                raise to_sandbox_error(exc, op="export_file", path=path) from exc
            data, size = result.get("data"), result.get("size_bytes")
            if not isinstance(data, (bytes, bytearray)) or not isinstance(size, int) or len(data) > length:
                raise SandboxTerminalError("the sandbox-sidecar daemon answered a ranged read_file with something else")
            return bytes(data), size

        def changed(was: int, now: int) -> SandboxError:
            if now > max_bytes:
                return SandboxFileTooLargeError(path, now, max_bytes)
            return SandboxError(f"{path!r} changed while it was exported ({was} bytes, then {now}); export it again once it is complete")

        _, size = piece(0, 0)
        if size > max_bytes:
            raise SandboxFileTooLargeError(path, size, max_bytes)
        written = 0
        while written < size:
            data, now = piece(written, min(self.piece_bytes, size - written))
            if now != size or not data:
                raise changed(size, now)
            dest.write(data)
            written += len(data)
        _, now = piece(0, 0)
        if now != size:
            raise changed(size, now)
        return written

    def list_directory(self, sandbox: str, path: str) -> List[Tuple[str, bool]]:
        """``(name, is_dir)`` pairs sorted by name; a non-UTF-8 name keeps its bytes as surrogate escapes."""
        if not isinstance(path, str):
            raise SandboxError(f"path must be a string, got {type(path).__name__}")
        sandbox = self.sandbox_id(sandbox)
        try:
            entries = self.client.list_directory(sandbox, path)
        except SidecarError as exc:
            raise to_sandbox_error(exc, op="list_directory", path=path) from exc
        return [(_name(e.get("name")), bool(e.get("is_dir"))) for e in entries if isinstance(e, Mapping)]

    # -- durable processes -------------------------------------------------------

    def start_command(
        self,
        sandbox: str,
        command: Union[str, Sequence[str]],
        *,
        name: Optional[str] = None,
        timeout: Optional[float] = None,
        env: Optional[Mapping[str, str]] = None,
        cwd: Optional[str] = None,
    ) -> SidecarProcess:
        """Start ``command`` (a shell string, or an argv list) as a durable process; answers at once.

        The process outlives this call, the task and the worker, until it
        ends, is signalled (:meth:`signal_process`) or its sandbox ends;
        ``timeout`` is its budget in seconds (none by default). With a
        ``name``, a start whose name already names a process of the sandbox
        (running or ended) starts nothing and returns that one with
        ``existing=True``: a retried task that starts its job ``"train"``
        again gets the first one. Its output is read with :meth:`read_output`
        or :meth:`follow_output`, its end with :meth:`wait_process`.
        """
        if isinstance(command, str):
            shell, argv = command, None
        elif isinstance(command, (list, tuple)) and command and all(isinstance(a, str) for a in command):
            shell, argv = None, list(command)
        else:
            raise SandboxError(f"command must be a shell command string or a non-empty list of strings, got {command!r}")
        if name is not None and (not isinstance(name, str) or not name):
            raise SandboxError(f"name must be a non-empty string or None, got {name!r}")
        if timeout is not None and not _positive_finite(timeout):
            raise SandboxError(f"timeout must be a positive number of seconds or None, got {timeout!r}")
        sandbox = self.sandbox_id(sandbox)
        try:
            result = self.client.start_command(
                sandbox,
                shell,
                argv=argv,
                env=env,
                cwd=cwd,
                timeout_s=float(timeout) if timeout is not None else None,
                name=name,
            )
        except SidecarError as exc:
            raise to_sandbox_error(exc, op="start_command") from exc
        started = process_from_wire(result)
        if not started.process:
            raise SandboxTerminalError("the sandbox-sidecar daemon answered start_command without a process id")
        return started

    def read_output(
        self,
        sandbox: str,
        process: str,
        *,
        stream: str = "stdout",
        offset: int = 0,
        max_bytes: Optional[int] = None,
        wait_s: Optional[float] = None,
    ) -> SidecarOutput:
        """One read of a durable process's ``stream`` from byte ``offset`` (counted from its start).

        ``wait_s``: when nothing is there yet and the process runs, wait up
        to this long for bytes or its end. Bytes the daemon's log no longer
        holds are skipped: the result's ``offset`` is then past the one asked
        for, by ``dropped``. Go on at ``next_offset``.
        """
        sandbox = self.sandbox_id(sandbox)
        _check_process_args(process, stream, offset)
        if max_bytes is not None and (not isinstance(max_bytes, int) or isinstance(max_bytes, bool) or max_bytes <= 0):
            raise SandboxError(f"max_bytes must be an integer > 0 or None, got {max_bytes!r}")
        if wait_s is not None and not _positive_finite(wait_s):
            raise SandboxError(f"wait_s must be a positive number of seconds or None, got {wait_s!r}")
        try:
            result = self.client.read_output(
                sandbox, process, stream=stream, offset=offset, max_bytes=max_bytes, wait_s=wait_s
            )
            return output_from_wire(result, offset)
        except SidecarError as exc:
            raise to_sandbox_error(exc, op="read_output") from exc

    def follow_output(
        self,
        sandbox: str,
        process: str,
        *,
        stream: str = "stdout",
        offset: int = 0,
        wait_s: float = 30.0,
        reconnect_timeout: float = 60.0,
        on_dropped: Optional[Callable[[int, int], None]] = None,
    ) -> OutputFollower:
        """An iterator over a durable process's ``stream`` from ``offset``: ``bytes`` chunks until it ends.

        Each read waits on the daemon for bytes (no polling). A broken
        connection, or a daemon away for up to ``reconnect_timeout`` seconds
        (restarting), is survived: the follower reads again from where it
        was, so nothing is lost or repeated. Bytes the daemon's log dropped
        before they were read are logged and counted (``dropped``). Once the
        iteration ended, its ``exit_code`` and ``reason`` say how the process
        ended; ``offset`` is where a later follower would go on. Errors are
        raised as ``SandboxError`` / ``SandboxTerminalError``, as every op's.
        """
        sandbox = self.sandbox_id(sandbox)
        _check_process_args(process, stream, offset)
        if not _positive_finite(wait_s):
            raise SandboxError(f"wait_s must be a positive number of seconds, got {wait_s!r}")
        if not (_positive_finite(reconnect_timeout) or reconnect_timeout == 0):
            raise SandboxError(f"reconnect_timeout must be a number of seconds >= 0, got {reconnect_timeout!r}")
        client = self.client
        return OutputFollower(
            lambda at, wait: client.read_output(sandbox, process, stream=stream, offset=at, wait_s=wait),
            offset=offset,
            wait_s=wait_s,
            reconnect_timeout=reconnect_timeout,
            on_dropped=on_dropped,
            map_error=lambda exc: to_sandbox_error(exc, op="read_output"),
            what=f"process {process} of sandbox {sandbox} ({stream})",
        )

    def wait_process(self, sandbox: str, process: str, *, timeout: Optional[float] = None) -> SidecarProcessInfo:
        """Wait for a durable process's end, up to ``timeout`` seconds (``None``: however long it takes).

        Returns the process; ``running`` is still True when the timeout came
        first, else ``exit_code`` (128+N for signal N), ``reason``
        (``exited``, ``killed``, ``timed_out``, ``oom_killed``,
        ``sandbox_terminated``) and ``ended_at`` say how it ended. Long waits
        are made of the daemon's waits of at most 600 s each.
        """
        sandbox = self.sandbox_id(sandbox)
        _check_process_args(process)
        if timeout is not None and not (_positive_finite(timeout) or timeout == 0):
            raise SandboxError(f"timeout must be a number of seconds >= 0 or None, got {timeout!r}")
        deadline = None if timeout is None else time.monotonic() + float(timeout)
        while True:
            wait = _MAX_PROCESS_WAIT_S if deadline is None else min(_MAX_PROCESS_WAIT_S, deadline - time.monotonic())
            try:
                result = self.client.wait_process(sandbox, process, timeout_s=wait if wait > 0 else None)
            except SidecarError as exc:
                raise to_sandbox_error(exc, op="wait_process") from exc
            info = process_info_from_wire(result)
            if not info.running or (deadline is not None and time.monotonic() >= deadline):
                return info

    def signal_process(self, sandbox: str, process: str, signal: str = "TERM") -> None:
        """Send ``signal`` (``TERM``, ``KILL``, ``INT``, ``HUP``, ``USR1`` or ``USR2``) to the process's group.

        A process that has already ended raises ``SandboxError`` with code
        ``process_ended``.
        """
        sandbox = self.sandbox_id(sandbox)
        _check_process_args(process)
        if signal not in SIGNALS:
            raise SandboxError(f"signal must be one of {', '.join(SIGNALS)}, got {signal!r}")
        try:
            self.client.signal_process(sandbox, process, signal)
        except SidecarError as exc:
            raise to_sandbox_error(exc, op="signal_process") from exc

    def list_processes(self, sandbox: str) -> List[SidecarProcessInfo]:
        """Every durable process the sandbox keeps a record of (running, and its last ended ones), oldest first."""
        sandbox = self.sandbox_id(sandbox)
        try:
            processes = self.client.list_processes(sandbox)
        except SidecarError as exc:
            raise to_sandbox_error(exc, op="list_processes") from exc
        return [process_info_from_wire(p) for p in processes if isinstance(p, Mapping)]

    # -- code contexts -----------------------------------------------------------

    def run_code(
        self,
        sandbox: str,
        code: str,
        context: str = DEFAULT_CONTEXT,
        *,
        timeout: Optional[float] = None,
        max_output_bytes: Optional[int] = None,
        on_stdout: Optional[Callable[[bytes], None]] = None,
        on_stderr: Optional[Callable[[bytes], None]] = None,
    ) -> SidecarCodeResult:
        """Run ``code``, a cell of Python, in the sandbox's code context ``context``.

        The context (made on first use) keeps its variables, imports and
        open files from one cell to the next, as a notebook's kernel does;
        its process is the sandbox's (same user, limits and network). The
        cell's statements run in order, then the value of its last one when
        it is an expression becomes its last result. ``timeout`` (seconds;
        ``None``: the daemon's default) interrupts the cell with a
        ``KeyboardInterrupt`` and keeps the context; a cell that ignores the
        interrupt loses its context (``context_lost``).

        ``on_stdout`` and ``on_stderr`` get the output's ``bytes`` as the
        cell writes them (on the connection's reader thread: keep them
        quick); a callback slower than the cell loses chunks, never stalls
        it (``stdout_stream_dropped`` counts them). With ``log_output``
        and no callbacks, the output goes to the ``sandbox_sidecar.output``
        logger line by line.

        An exception in the cell, a timeout, a lost context are results, not
        errors: see :class:`~sandbox_sidecar.code.SidecarCodeResult`. An
        image without ``python3`` raises ``SandboxTerminalError`` (code
        ``no_python``); a context still running an earlier cell
        ``SandboxError`` (``context_busy``). Cells of one sandbox run one at
        a time, after its commands, as its commands do.

        A daemon that does not answer within ``timeout`` plus the grace has
        the context ended (the sandbox lives on) and the result says
        ``timed_out`` and ``context_lost``; until the daemon has finished
        the cell given up on, the sandbox may refuse another command or
        cell for a moment (``quota_exceeded``).
        """
        if not isinstance(code, str):
            raise SandboxError(f"code must be a string of Python, got {type(code).__name__}")
        if not isinstance(context, str) or not context:
            raise SandboxError(f"context must be a context's name (a non-empty str), got {context!r}")
        if timeout is not None and not _positive_finite(timeout):
            raise SandboxError(f"timeout must be a positive number of seconds or None, got {timeout!r}")
        if max_output_bytes is not None and (
            not isinstance(max_output_bytes, int) or isinstance(max_output_bytes, bool) or max_output_bytes < 0
        ):
            raise SandboxError(f"max_output_bytes must be an integer >= 0 or None, got {max_output_bytes!r}")
        for name, callback in (("on_stdout", on_stdout), ("on_stderr", on_stderr)):
            if callback is not None and not callable(callback):
                raise SandboxError(f"{name} must be a callable taking bytes, or None")
        sandbox = self.sandbox_id(sandbox)
        on_output: Optional[Callable[[str, bytes], None]] = None
        if on_stdout is not None or on_stderr is not None:
            targets = {"stdout": on_stdout, "stderr": on_stderr}

            def on_output(stream: str, data: bytes) -> None:
                target = targets.get(stream)
                if target is not None:
                    target(data)

        elif self._log_output:
            on_output = _OutputLogger(sandbox)
        try:
            with self._command_lock(sandbox):
                result = self.client.run_code(
                    sandbox,
                    code,
                    context=context,
                    timeout_s=float(timeout) if timeout is not None else None,
                    max_output_bytes=max_output_bytes,
                    on_output=on_output,
                )
                if isinstance(on_output, _OutputLogger):
                    on_output.flush()
        except SidecarTimeoutError:
            # The daemon did not answer within the cell's budget plus a grace.
            # The sure way to stop the cell is to end its context (not the
            # sandbox: its files and other contexts are not the cell's).
            self._delete_context_quietly(sandbox, context)
            return SidecarCodeResult(
                context=context,
                stdout="",
                stderr="the sandbox-sidecar daemon did not answer in time; the context was ended",
                timed_out=True,
                context_lost=True,
                reason="timed_out",
            )
        except SidecarError as exc:
            raise to_sandbox_error(exc, op="run_code") from exc
        return code_result_from_wire(result, context)

    def _delete_context_quietly(self, sandbox: str, context: str) -> None:
        try:
            self.client.delete_context(sandbox, context)
        except SidecarError:
            pass  # not answering, or already gone: the daemon ends it with the cell's budget or the sandbox

    def list_contexts(self, sandbox: str) -> List[SidecarContextInfo]:
        """The sandbox's code contexts, by name: each one's ``running`` and ``execution_count``."""
        sandbox = self.sandbox_id(sandbox)
        try:
            contexts = self.client.list_contexts(sandbox)
        except SidecarError as exc:
            raise to_sandbox_error(exc, op="list_contexts") from exc
        return [context_info_from_wire(c) for c in contexts if isinstance(c, Mapping)]

    def restart_context(self, sandbox: str, context: str = DEFAULT_CONTEXT) -> None:
        """Drop the context's variables: its process ends, it stays listed at ``execution_count`` 0, and its next
        cell starts a fresh one at ``execution_count`` 1.

        A context that does not exist raises ``SandboxError`` (code ``context_not_found``).
        """
        self._end_context("restart_context", sandbox, context)

    def delete_context(self, sandbox: str, context: str) -> None:
        """End the context, its process and its state. One that does not exist raises ``SandboxError``
        (code ``context_not_found``)."""
        self._end_context("delete_context", sandbox, context)

    def _end_context(self, op: str, sandbox: str, context: str) -> None:
        if not isinstance(context, str) or not context:
            raise SandboxError(f"context must be a context's name (a non-empty str), got {context!r}")
        sandbox = self.sandbox_id(sandbox)
        try:
            getattr(self.client, op)(sandbox, context)
        except SidecarError as exc:
            raise to_sandbox_error(exc, op=op) from exc
    # -- snapshots and forks -----------------------------------------------------

    def snapshot(self, sandbox: str, name: str, *, memory: bool = False) -> Mapping[str, Any]:
        """Make the sandbox's files the image ``name``, which later runs create sandboxes from.

        A backend made with ``image=name`` (or a ``create(image=name)``) then
        starts with this sandbox's ``/workspace`` and ``/tmp``. With
        ``memory=True`` (gVisor only; elsewhere ``SandboxTerminalError``
        with ``code`` ``not_supported``) the image keeps its processes and
        their memory too, and those sandboxes start with them running
        where they were, ``/tmp/.sandbox-restored`` telling the guest to
        reseed. Returns the daemon's answer (``image``, ``digest``,
        ``size_bytes``, ``files``, ``frozen``, ...).
        """
        sandbox = self.sandbox_id(sandbox)
        try:
            return self.client.snapshot(sandbox, name, memory=memory)
        except SidecarError as exc:
            raise to_sandbox_error(exc, op="snapshot") from exc

    def fork(
        self, sandbox: str, count: int = 1, *, owner: Optional[str] = None, ttl_s: Optional[float] = None, memory: bool = False
    ) -> List[str]:
        """``count`` new sandboxes as copies of ``sandbox`` (its files now, its spec, owner and lease); their ids.

        All or nothing: a fork the daemon's quotas cannot take whole raises
        ``SandboxTerminalError`` (``quota_exceeded``) and makes none. With
        ``memory=True`` (gVisor only, as :meth:`snapshot`) each copy also
        has the source's processes and their memory, its own from then on.
        """
        sandbox = self.sandbox_id(sandbox)
        try:
            result = self.client.fork(sandbox, count, owner=owner, ttl_s=ttl_s, memory=memory)
        except SidecarError as exc:
            raise to_sandbox_error(exc, op="fork") from exc
        host = self._host()
        return [f"{s}{HOST_SEPARATOR}{host}" if host else s for s in result.get("sandboxes") or []]

    # -- paused sandboxes --------------------------------------------------------

    def pause(self, sandbox: str) -> Mapping[str, Any]:
        """Pause ``sandbox`` while the run waits (a human's review, an external event, a later task).

        Its processes stop where they are and use no CPU; its files,
        processes, code contexts, owner and lease stay. Any later use of it,
        an ``attach`` by the next task included, resumes it first, so a DAG
        need not call :meth:`resume`. It still ends at its lease (``renew``
        extends it without resuming it). Returns the daemon's answer
        (``state``, ``paused_at``, ``memory_released``, ``expires_at``,
        ``remaining_s``). A sandbox running a command raises
        ``SandboxTerminalError`` (``busy``).
        """
        sandbox = self.sandbox_id(sandbox)
        try:
            return self.client.pause(sandbox)
        except SidecarError as exc:
            raise to_sandbox_error(exc, op="pause") from exc

    def resume(self, sandbox: str) -> Mapping[str, Any]:
        """Let a paused ``sandbox`` run again, its processes going on where they were; the daemon's answer."""
        sandbox = self.sandbox_id(sandbox)
        try:
            return self.client.resume(sandbox)
        except SidecarError as exc:
            raise to_sandbox_error(exc, op="resume") from exc

    # -- attaching ---------------------------------------------------------------

    def attach(self, sandbox: str, *, owner: str, holder: str) -> AttachedSandbox:
        """Claim ``sandbox`` for ``holder``, atomically in the daemon.

        Refused (``SandboxTerminalError``) when the sandbox's owner is not
        ``owner`` or another holder has it; the same holder may attach again.
        The refusals say what upstream's do (a sandbox that carries no owner,
        the owner it carries, who holds it), whichever backend runs.
        """
        handle = sandbox
        sandbox = self.sandbox_id(sandbox)
        try:
            result = self.client.attach(sandbox, owner=owner, holder=holder)
        except SidecarError as exc:
            raise _attach_refusal(exc, handle, owner, holder, self.name) from exc
        remaining = result.get("remaining_s")
        if not isinstance(remaining, (int, float)):
            expires_at = result.get("expires_at")
            remaining = max(0.0, expires_at - time.time()) if isinstance(expires_at, (int, float)) else None
        workdir = result.get("workdir")
        stamp = result.get("network")
        network = read_network_stamp(stamp)
        if network is None and stamp:
            log.warning("Sandbox %s carries a network stamp this backend cannot read: %r; saying nothing about its network", handle, stamp)
        return AttachedSandbox(
            remaining_lifetime=float(remaining) if remaining is not None else None,
            network=network,
            workdir=workdir if isinstance(workdir, str) and workdir else None,
        )

    def release(self, sandbox: str, *, holder: str) -> None:
        """Give up ``holder``'s claim. Idempotent; never destroys the sandbox.

        A sandbox that no longer exists is a ``SandboxTerminalError``, as upstream
        has it for both ``attach`` and ``release``.
        """
        sandbox = self.sandbox_id(sandbox)
        try:
            if not self.client.release(sandbox, holder=holder):
                # Nothing was cleared: not held by holder, or gone. The daemon
                # answers both alike, so ask which (read_tags of a gone one is
                # not_found).
                self.client.read_tags(sandbox)
        except SidecarError as exc:
            raise to_sandbox_error(exc, op="release") from exc

    def read_tags(self, sandbox: str) -> Mapping[str, str]:
        """The sandbox's tags (``airflow_owner``, ``airflow_holder``, ...). A gone sandbox is terminal.

        A tag that is not set is left out, as upstream's tag stores have it: an
        unheld sandbox has no ``airflow_holder``, an unowned one no ``airflow_owner``.
        """
        sandbox = self.sandbox_id(sandbox)
        try:
            tags = self.client.read_tags(sandbox)
        except SidecarError as exc:
            raise to_sandbox_error(exc, op="read_tags") from exc
        return {k: v for k, v in tags.items() if v != ""}

    def write_tags(self, sandbox: str, tags: Mapping[str, str]) -> None:
        """Make the sandbox's tags ``tags``.

        Only what differs from the current tags is sent, so a read-modify-write
        of the whole map works even though ``airflow_workdir`` and
        ``airflow_network`` are read-only. Dropping ``airflow_holder`` releases
        the claim; the daemon cannot delete other tags, so another tag left out
        is set to ``""``.
        """
        sandbox = self.sandbox_id(sandbox)
        try:
            current = self.client.read_tags(sandbox)
            changes = {k: v for k, v in tags.items() if current.get(k) != v}
            for key in current:
                if key not in tags and current[key] != "":
                    if key == HOLDER_TAG or not key.startswith("airflow_"):
                        changes[key] = ""
            if changes:
                self.client.write_tags(sandbox, changes)
        except SidecarError as exc:
            raise to_sandbox_error(exc, op="write_tags") from exc
