"""The plain client: one Unix-socket connection to the daemon, safe to share between threads.

Requests are pipelined: any number of threads may have a call in flight on the
one connection, each waiting for the response with its own id, which a reader
thread routes to it. Nothing connects until the first call.
"""

from __future__ import annotations

import itertools
import logging
import math
import os
import socket
import threading
import time
import weakref
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Union

from . import errors as _errors

_log = logging.getLogger(__name__)
from .errors import (
    SidecarConnectionError,
    SidecarError,
    SidecarProtocolError,
    SidecarTimeoutError,
)
from .processes import OutputFollower
from .framing import (
    DEFAULT_MAX_FRAME_BYTES,
    HEADER_SIZE,
    PROTOCOL_VERSION,
    decode_body,
    encode_request,
    is_event,
    pack_frame,
    parse_length,
    result_from_response,
)

__all__ = ["SidecarClient", "DEFAULT_SOCKET_PATH", "SOCKET_ENV_VAR", "resolve_socket_path"]

DEFAULT_SOCKET_PATH = "/run/sandbox-sidecar/sidecar.sock"
SOCKET_ENV_VAR = "SANDBOX_SIDECAR_SOCKET"

DEFAULT_CONNECT_TIMEOUT = 5.0
# Budget for an op that has no timeout of its own (create, file ops, destroy...).
DEFAULT_OP_TIMEOUT = 60.0
# Added to every call's own budget before the client gives up waiting: the
# daemon's SIGTERM-to-SIGKILL grace (2 s), the sandbox teardown, the trip back.
DEFAULT_GRACE = 15.0
# How long a blocked socket operation waits before looking at the clock and the
# connection's state again. Not a deadline: deadlines are per call.
_POLL_INTERVAL = 0.5
_RECV_CHUNK = 256 * 1024

# Ops that may be sent a second time after the connection broke with the first
# one already written: running them twice leaves the same state as once.
# create, run_command and run_code are not among them: a second create could
# leave a sandbox nobody knows about, and a second run_command (or cell) runs
# twice.
RETRY_SAFE_OPS = frozenset(
    {
        "hello",
        "health",
        "list",
        "read_file",
        "write_file",
        "list_directory",
        "destroy",
        "renew",
        "attach",
        "release",
        "read_tags",
        "write_tags",
        "destroy_run",
        "read_output",
        "wait_process",
        "list_processes",
        "list_contexts",
        # Once or twice, the context's state is gone; a second one may answer
        # context_not_found, for the first already ended it.
        "restart_context",
        "delete_context",
    }
)

Bytes = Union[bytes, bytearray, memoryview]


def resolve_socket_path(socket_path: Optional[str] = None) -> str:
    """The socket to use: the argument, else ``$SANDBOX_SIDECAR_SOCKET``, else the default."""
    if socket_path:
        return os.fspath(socket_path)
    return os.environ.get(SOCKET_ENV_VAR) or DEFAULT_SOCKET_PATH


class _Broken(Exception):
    """Internal: the connection failed. ``sent`` says whether the request got out whole."""

    def __init__(self, reason: str, *, sent: bool) -> None:
        super().__init__(reason)
        self.reason = reason
        self.sent = sent


class _Pending:
    __slots__ = ("event", "response", "failure", "on_event")

    def __init__(self, on_event: Optional[Callable[[str, bytes], None]] = None) -> None:
        self.event = threading.Event()
        self.response: Optional[dict] = None
        self.failure: Optional[BaseException] = None
        self.on_event = on_event


class _Connection:
    """One socket, its reader thread and the calls waiting on it."""

    def __init__(self, sock: socket.socket, max_frame_bytes: int) -> None:
        self.sock = sock
        self.max_frame_bytes = max_frame_bytes
        self.pid = os.getpid()
        self.hello: dict = {}
        self._ids = itertools.count(1)
        self._send_lock = threading.Lock()
        self._pending: Dict[int, _Pending] = {}
        self._pending_lock = threading.Lock()
        # Set once, under _pending_lock, when the connection can carry nothing more.
        self._dead: Optional[BaseException] = None
        # What the daemon said when it refused the connection as a whole (an
        # id-0 error frame: unauthorized, busy...). Any call on this connection
        # reports it rather than a bare broken pipe.
        self._refusal: Optional[SidecarError] = None
        self._reader = threading.Thread(target=self._read_loop, name="sandbox-sidecar-reader", daemon=True)
        self._reader.start()

    @property
    def alive(self) -> bool:
        return self._dead is None

    # -- sending -----------------------------------------------------------------

    def request(
        self,
        op: str,
        args: Optional[Mapping[str, Any]],
        deadline: float,
        on_event: Optional[Callable[[str, bytes], None]] = None,
    ) -> dict:
        self._raise_if_dead()
        request_id = next(self._ids)
        body = encode_request(request_id, op, args)
        if len(body) > self.max_frame_bytes:
            raise SidecarError(
                "frame_too_large",
                f"the {op} request is {len(body)} bytes, more than the daemon's "
                f"{self.max_frame_bytes}-byte frame limit; send less in one call",
                {"max_frame_bytes": self.max_frame_bytes, "frame_bytes": len(body)},
            )
        pending = _Pending(on_event)
        with self._pending_lock:
            self._raise_if_dead()
            self._pending[request_id] = pending
        try:
            self._send(pack_frame(body), deadline, op)
            if not pending.event.wait(max(0.0, deadline - time.monotonic())):
                raise SidecarTimeoutError(
                    f"the daemon did not answer {op} in time; it may be overloaded or stuck",
                    {"op": op},
                )
        finally:
            with self._pending_lock:
                self._pending.pop(request_id, None)
        failure = pending.failure
        if isinstance(failure, _Broken):
            # The request was written whole before the connection failed: the
            # daemon may have acted on it.
            raise _Broken(failure.reason, sent=True)
        if failure is not None:
            raise failure
        assert pending.response is not None
        return result_from_response(pending.response)

    def _raise_if_dead(self) -> None:
        if self._refusal is not None:
            raise self._refusal
        if self._dead is not None:
            raise _Broken(str(self._dead), sent=False)

    def _send(self, frame: bytes, deadline: float, op: str) -> None:
        if not self._send_lock.acquire(timeout=max(0.0, deadline - time.monotonic())):
            raise SidecarTimeoutError(f"could not send {op} in time: the connection is busy sending", {"op": op})
        failure: Optional[BaseException] = None
        cut_off = False
        try:
            view = memoryview(frame)
            while view:
                if self._dead is not None:
                    failure = _Broken(str(self._dead), sent=False)
                    break
                if time.monotonic() >= deadline:
                    # Half a frame on the wire leaves the stream unusable.
                    cut_off = len(view) != len(frame)
                    failure = SidecarTimeoutError(
                        f"could not send {op} in time: the daemon is not reading", {"op": op}
                    )
                    break
                try:
                    sent = self.sock.send(view)
                except socket.timeout:
                    continue
                except OSError as exc:
                    failure = _Broken(f"sending failed: {exc}", sent=False)
                    break
                view = view[sent:]
        finally:
            self._send_lock.release()
        if failure is None:
            return
        if cut_off:
            self.kill(_Broken("a request was cut off mid-frame", sent=False))
        elif isinstance(failure, _Broken) and self._dead is None:
            # The peer is gone. Let the reader drain what the daemon said before
            # it closed (an unauthorized or busy frame explains why) rather than
            # reporting a bare broken pipe.
            self._reader.join(min(1.0, max(0.0, deadline - time.monotonic())))
            self.kill(failure)
        if isinstance(failure, _Broken) and self._refusal is not None:
            raise self._refusal
        raise failure

    # -- receiving ---------------------------------------------------------------

    def _read_loop(self) -> None:
        failure: BaseException
        try:
            while True:
                header = self._recv_exact(HEADER_SIZE, at_boundary=True)
                length = parse_length(header, self.max_frame_bytes)
                message = decode_body(self._recv_exact(length, at_boundary=False))
                self._route(message)
        except _Broken as exc:
            failure = exc
        except SidecarError as exc:  # a protocol error, or a connection-level error frame
            failure = exc
        except Exception as exc:  # pragma: no cover - a bug here must not hang callers
            failure = SidecarProtocolError(f"reading from the daemon failed: {exc!r}")
        self.kill(failure)

    def _recv_exact(self, n: int, *, at_boundary: bool) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            if self._dead is not None:
                raise _Broken(str(self._dead), sent=True)
            try:
                chunk = self.sock.recv(min(n - len(buf), _RECV_CHUNK))
            except socket.timeout:
                continue
            except OSError as exc:
                raise _Broken(f"reading failed: {exc}", sent=True) from None
            if not chunk:
                where = "between frames" if at_boundary and not buf else "in the middle of a frame"
                raise _Broken(f"the daemon closed the connection {where}", sent=True)
            buf += chunk
        return bytes(buf)

    def _route(self, message: dict) -> None:
        request_id = message.get("id")
        if is_event(message):
            # Streamed output of a call that asked for it; any other event
            # (another id, id 0, a kind this client does not know) is ignored,
            # as the protocol asks of clients.
            with self._pending_lock:
                pending = self._pending.get(request_id) if request_id else None
            data = message.get("data")
            if pending is not None and pending.on_event is not None and isinstance(data, (bytes, bytearray)):
                try:
                    pending.on_event(str(message.get("event")), bytes(data))
                except Exception:  # a caller's callback must not take the connection down
                    _log.exception("an on_output callback raised; the stream goes on")
            return
        if request_id == 0 or request_id is None:
            # A connection-level error: the daemon could not tie it to a request
            # (unauthorized, busy, frame_too_large...). No waiting call can be
            # sure its request was understood, so all of them get the error and
            # the connection is dropped.
            if message.get("ok") is False:
                self._refusal = _errors_from(message)
                raise self._refusal
            raise SidecarProtocolError("the daemon sent a response without a request id")
        with self._pending_lock:
            pending = self._pending.get(request_id)
        if pending is not None:  # else: a late answer to a call that already timed out
            pending.response = message
            pending.event.set()

    # -- teardown ----------------------------------------------------------------

    def kill(self, failure: BaseException) -> None:
        """Fail every waiting call with ``failure`` and shut the socket (idempotent)."""
        with self._pending_lock:
            if self._dead is None:
                self._dead = failure
            waiting = list(self._pending.values())
            self._pending.clear()
        for pending in waiting:
            if pending.failure is None and pending.response is None:
                pending.failure = failure
            pending.event.set()
        if os.getpid() == self.pid:
            try:
                self.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        if threading.current_thread() is self._reader or not self._reader.is_alive():
            self._close_socket()

    def _close_socket(self) -> None:
        # Under the send lock so no sender is inside send() on this descriptor.
        got = self._send_lock.acquire(timeout=_POLL_INTERVAL * 4)
        try:
            self.sock.close()
        finally:
            if got:
                self._send_lock.release()

    def abandon_after_fork(self) -> None:
        """In a forked child: forget the parent's connection without touching its stream."""
        self._dead = SidecarConnectionError(_errors.CONNECTION_LOST, "connection inherited across fork")
        try:
            self.sock.close()  # closes the child's copy only; no shutdown, the parent still uses it
        except OSError:
            pass


def _errors_from(message: Mapping[str, Any]) -> SidecarError:
    try:
        result_from_response(message)
    except SidecarError as exc:
        return exc
    return SidecarProtocolError("unexpected connection-level frame")  # pragma: no cover


_live_clients: "weakref.WeakSet[SidecarClient]" = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for client in list(_live_clients):
        client._reset_after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


class SidecarClient:
    """A connection to the sandbox-sidecar daemon, opened on first use.

    One instance holds one connection and may be used from many threads at
    once: requests are pipelined on it and matched to their answers by id. The
    connection is kept open, because sandboxes created without an owner or a
    ttl live as long as the connection that made them (plus the daemon's
    grace). If it breaks, the next call reconnects, and a call that met the
    break is retried once on a fresh connection, unless it was ``create`` or
    ``run_command`` and had already been sent (running those twice is not
    harmless); those raise :class:`SidecarConnectionError`.

    Every call has a deadline: its own timeout (``run_command``'s
    ``timeout_s``, otherwise ``op_timeout``) plus ``grace``. Frames from the
    daemon are read only up to the ``max_frame_bytes`` its ``hello`` reported.

    :param socket_path: the daemon's socket; default ``$SANDBOX_SIDECAR_SOCKET``
        or ``/run/sandbox-sidecar/sidecar.sock``.
    :param connect_timeout: seconds to connect and say hello.
    :param op_timeout: the budget of an op without a timeout of its own.
    :param grace: seconds added to every call's budget before giving up on it.
    :param max_frame_bytes: an upper bound of the client's own on frame size;
        the smaller of it and the daemon's limit applies.
    :param client_name: how the daemon's log names this client.
    """

    def __init__(
        self,
        socket_path: Optional[str] = None,
        *,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        op_timeout: float = DEFAULT_OP_TIMEOUT,
        grace: float = DEFAULT_GRACE,
        max_frame_bytes: Optional[int] = None,
        client_name: str = "sandbox-sidecar-client (python)",
    ) -> None:
        check_timeouts(connect_timeout=connect_timeout, op_timeout=op_timeout, grace=grace)
        if max_frame_bytes is not None and max_frame_bytes < 1024:
            raise ValueError(f"max_frame_bytes must be at least 1024, got {max_frame_bytes!r}")
        self._socket_path = socket_path
        self.connect_timeout = float(connect_timeout)
        self.op_timeout = float(op_timeout)
        self.grace = float(grace)
        self.max_frame_bytes = max_frame_bytes
        self.client_name = client_name
        self._conn: Optional[_Connection] = None
        self._conn_lock = threading.Lock()
        self._closed = False
        _live_clients.add(self)

    @property
    def socket_path(self) -> str:
        return resolve_socket_path(self._socket_path)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.socket_path!r})"

    # Copies (Airflow copies operators and their arguments) get a fresh, unconnected client.
    def __getstate__(self) -> dict:
        return {
            "socket_path": self._socket_path,
            "connect_timeout": self.connect_timeout,
            "op_timeout": self.op_timeout,
            "grace": self.grace,
            "max_frame_bytes": self.max_frame_bytes,
            "client_name": self.client_name,
        }

    def __setstate__(self, state: dict) -> None:
        state = dict(state)
        self.__init__(state.pop("socket_path"), **state)  # type: ignore[misc]

    def __enter__(self) -> "SidecarClient":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection. Connection-bound sandboxes it made end after the daemon's grace."""
        with self._conn_lock:
            self._closed = True
            conn, self._conn = self._conn, None
        if conn is not None:
            conn.kill(SidecarConnectionError(_errors.CLIENT_CLOSED, "the client was closed"))

    # -- the connection ----------------------------------------------------------

    def _reset_after_fork(self) -> None:
        self._conn_lock = threading.Lock()
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.abandon_after_fork()

    def _connection(self, deadline: float) -> _Connection:
        if not self._conn_lock.acquire(timeout=max(0.0, deadline - time.monotonic())):
            raise SidecarTimeoutError("timed out waiting for another thread to connect to the daemon")
        try:
            if self._closed:
                raise SidecarConnectionError(_errors.CLIENT_CLOSED, "the client was closed")
            conn = self._conn
            if conn is not None and conn.alive and conn.pid == os.getpid():
                return conn
            self._conn = None
            if conn is not None and conn.pid != os.getpid():
                conn.abandon_after_fork()
            conn = self._connect(min(deadline, time.monotonic() + self.connect_timeout))
            self._conn = conn
            return conn
        finally:
            self._conn_lock.release()

    def _connect(self, deadline: float) -> _Connection:
        path = self.socket_path
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(max(0.001, deadline - time.monotonic()))
            sock.connect(path)
        except FileNotFoundError:
            sock.close()
            raise SidecarConnectionError(
                _errors.DAEMON_UNREACHABLE,
                f"no daemon socket at {path}: is sandbox-sidecar running on this host? "
                f"(set {SOCKET_ENV_VAR} if it listens elsewhere)",
                {"socket": path},
            ) from None
        except PermissionError:
            sock.close()
            raise SidecarConnectionError(
                _errors.DAEMON_UNREACHABLE,
                f"permission denied on {path}: add this user to the daemon's socket group "
                "(sandbox-sidecar) and restart the worker",
                {"socket": path},
            ) from None
        except (socket.timeout, OSError) as exc:
            sock.close()
            raise SidecarConnectionError(
                _errors.DAEMON_UNREACHABLE,
                f"could not connect to the daemon at {path}: {exc}",
                {"socket": path},
            ) from None
        sock.settimeout(_POLL_INTERVAL)
        ceiling = self.max_frame_bytes or DEFAULT_MAX_FRAME_BYTES
        conn = _Connection(sock, min(ceiling, DEFAULT_MAX_FRAME_BYTES))
        try:
            hello = conn.request(
                "hello", {"versions": [PROTOCOL_VERSION], "client": self.client_name}, deadline
            )
        except _Broken as exc:
            conn.kill(exc)
            raise SidecarConnectionError(
                _errors.DAEMON_UNREACHABLE,
                f"the daemon at {path} dropped the connection during hello: {exc.reason}",
                {"socket": path},
            ) from None
        except BaseException as exc:
            conn.kill(exc)
            raise
        limits = hello.get("limits") if isinstance(hello.get("limits"), dict) else {}
        announced = limits.get("max_frame_bytes")
        if isinstance(announced, int) and announced > 0:
            conn.max_frame_bytes = min(announced, self.max_frame_bytes or announced)
        conn.hello = hello
        return conn

    # -- calls -------------------------------------------------------------------

    def call(
        self,
        op: str,
        args: Optional[Mapping[str, Any]] = None,
        *,
        timeout: Optional[float] = None,
        idempotent: Optional[bool] = None,
        on_event: Optional[Callable[[str, bytes], None]] = None,
    ) -> dict:
        """Send one request and return its ``result`` map; raise :class:`SidecarError` on failure.

        ``timeout`` is the call's own budget (default ``op_timeout``); the
        client waits that long plus ``grace`` for the answer. ``None`` values in
        ``args`` are left out. ``idempotent`` says whether a request that met a
        broken connection after it was sent may be sent again (default: by op,
        :data:`RETRY_SAFE_OPS`; an append is not).
        """
        budget = self.op_timeout if timeout is None else timeout
        if not _positive_finite(budget):
            raise ValueError(f"timeout must be a positive finite number, got {timeout!r}")
        deadline = time.monotonic() + budget + self.grace
        for attempt in (1, 2):
            conn = self._connection(deadline)
            try:
                return conn.request(op, args, deadline, on_event)
            except _Broken as exc:
                self._forget(conn)
                safe = op in RETRY_SAFE_OPS if idempotent is None else idempotent
                retryable = not exc.sent or safe
                if attempt == 1 and retryable:
                    continue
                if retryable:
                    message = f"the connection to the daemon broke twice in a row ({exc.reason})"
                else:
                    message = (
                        f"the connection to the daemon broke after {op} was sent ({exc.reason}); "
                        "it was not retried, so whether it took effect is unknown"
                    )
                raise SidecarConnectionError(_errors.CONNECTION_LOST, message, {"op": op}) from None
        raise AssertionError("unreachable")  # pragma: no cover

    def _forget(self, conn: _Connection) -> None:
        with self._conn_lock:
            if self._conn is conn:
                self._conn = None

    def hello(self) -> dict:
        """The daemon's ``hello`` result for the current connection (connecting if needed)."""
        deadline = time.monotonic() + self.connect_timeout + self.grace
        return dict(self._connection(deadline).hello)

    @property
    def limits(self) -> dict:
        """``hello``'s ``limits``: max_frame_bytes, max_file_bytes, max_timeout_s, ..."""
        limits = self.hello().get("limits")
        return dict(limits) if isinstance(limits, dict) else {}

    def health(self) -> dict:
        return self.call("health")

    def create(
        self,
        spec: Optional[Mapping[str, Any]] = None,
        *,
        labels: Optional[Mapping[str, str]] = None,
        ttl_s: Optional[float] = None,
        resources: Optional[Mapping[str, Any]] = None,
        image: Optional[str] = None,
        timeout: Optional[float] = None,
    ) -> dict:
        """Provision a sandbox. ``spec`` is the wire map (env, block_network, allow_egress_to, ...).

        ``resources`` asks for limits tighter than the daemon's: ``memory_bytes``,
        ``cpus``, ``pids``, ``disk_bytes`` (the daemon checks them; a limit it
        cannot enforce is the error ``spec_unenforceable``). ``image`` names
        the image the sandbox runs on (one of ``hello()["images"]``; ``None``:
        the daemon's default); an unknown one is the error ``image_not_found``,
        whose ``details["images"]`` lists those there are.

        Returns ``sandbox``, ``workdir``, ``network``, ``expires_at``, ``conn_bound``, ``image``.
        """
        return self.call(
            "create",
            {
                "spec": dict(spec) if spec is not None else None,
                "labels": _opt_map(labels),
                "ttl_s": ttl_s,
                "resources": dict(resources) if resources is not None else None,
                "image": image,
            },
            timeout=timeout,
        )

    def run_command(
        self,
        sandbox: str,
        command: Optional[str] = None,
        *,
        argv: Optional[Sequence[str]] = None,
        stdin: Optional[Bytes] = None,
        env: Optional[Mapping[str, str]] = None,
        cwd: Optional[str] = None,
        timeout_s: Optional[float] = None,
        max_output_bytes: Optional[int] = None,
        on_output: Optional[Callable[[str, bytes], None]] = None,
    ) -> dict:
        """Run a shell string (``command``) or an ``argv`` list; return the daemon's result map.

        With ``on_output``, the output is streamed: ``on_output("stdout" | "stderr", chunk)``
        is called, on the connection's reader thread (keep it quick), as the
        command writes, before this returns. A callback slower than the command
        loses chunks, never stalls it: the result's ``stdout_stream_dropped`` and
        ``stderr_stream_dropped`` count what was not streamed, and its
        ``stdout``/``stderr`` are the kept tails as without a stream.
        """
        budget = timeout_s
        if budget is None:
            budget = self.limits.get("default_timeout_s") or self.op_timeout
        return self.call(
            "run_command",
            {
                "sandbox": sandbox,
                "command": command,
                "argv": list(argv) if argv is not None else None,
                "stdin": bytes(stdin) if stdin is not None else None,
                "env": _opt_map(env),
                "cwd": cwd,
                "timeout_s": timeout_s,
                "max_output_bytes": max_output_bytes,
                "stream": True if on_output is not None else None,
            },
            timeout=budget,
            on_event=on_output,
        )

    def read_file(self, sandbox: str, path: str, *, max_bytes: Optional[int] = None) -> dict:
        """Returns ``data`` (bytes) and ``size_bytes``; a larger file is the error ``file_too_large``."""
        return self.call("read_file", {"sandbox": sandbox, "path": path, "max_bytes": max_bytes})

    def read_file_range(
        self, sandbox: str, path: str, *, offset: int = 0, length: Optional[int] = None, timeout: Optional[float] = None
    ) -> dict:
        """One piece of a regular file: ``data`` (at most ``length`` bytes from ``offset``), ``size_bytes``
        (the whole file's size), ``offset`` and ``eof``. ``length=0`` asks for the size alone."""
        return self.call(
            "read_file", {"sandbox": sandbox, "path": path, "offset": offset, "length": length}, timeout=timeout
        )

    def write_file(
        self,
        sandbox: str,
        path: str,
        data: Bytes,
        *,
        mode: Optional[int] = None,
        offset: Optional[int] = None,
        append: bool = False,
    ) -> dict:
        """Write a whole file (``mode`` applies), or with ``offset``/``append`` a piece of an existing one.

        A piece returns ``size_bytes``, the file's size after. An append is
        never resent after a broken connection (it could land twice); a write
        at an offset is.
        """
        args: dict = {"sandbox": sandbox, "path": path, "data": bytes(data)}
        if append:
            args["append"] = True
            return self.call("write_file", args, idempotent=False)
        if offset is not None:
            args["offset"] = offset
        else:
            args["mode"] = mode
        return self.call("write_file", args)

    def list_directory(self, sandbox: str, path: str) -> List[dict]:
        """Entries as maps with ``name`` (str, or bytes when not UTF-8) and ``is_dir``."""
        entries = self.call("list_directory", {"sandbox": sandbox, "path": path}).get("entries") or []
        return list(entries)

    def destroy(self, sandbox: str) -> None:
        self.call("destroy", {"sandbox": sandbox})

    def renew(self, sandbox: str, ttl_s: float) -> dict:
        """Returns ``expires_at`` and ``remaining_s``."""
        return self.call("renew", {"sandbox": sandbox, "ttl_s": ttl_s})

    def attach(self, sandbox: str, *, owner: str, holder: str) -> dict:
        """Atomically claim an owned sandbox for ``holder``. Returns remaining_s, expires_at, workdir, network, holder."""
        return self.call("attach", {"sandbox": sandbox, "owner": owner, "holder": holder})

    def release(self, sandbox: str, *, holder: str) -> bool:
        """Clear ``holder``'s claim; True when a claim was cleared."""
        return bool(self.call("release", {"sandbox": sandbox, "holder": holder}).get("released"))

    def read_tags(self, sandbox: str) -> Dict[str, str]:
        return dict(self.call("read_tags", {"sandbox": sandbox}).get("tags") or {})

    def write_tags(self, sandbox: str, tags: Mapping[str, str]) -> Dict[str, str]:
        """Set the given tags (others are left alone); returns the tags after the write."""
        return dict(self.call("write_tags", {"sandbox": sandbox, "tags": dict(tags)}).get("tags") or {})

    def destroy_run(self, owner: str) -> List[str]:
        """Destroy every sandbox of ``owner`` this peer may destroy; returns their ids."""
        return list(self.call("destroy_run", {"owner": owner}).get("destroyed") or [])

    def list_sandboxes(self, owner: Optional[str] = None) -> List[dict]:
        return list(self.call("list", {"owner": owner}).get("sandboxes") or [])

    # -- durable processes -------------------------------------------------------

    def start_command(
        self,
        sandbox: str,
        command: Optional[str] = None,
        *,
        argv: Optional[Sequence[str]] = None,
        stdin: Optional[Bytes] = None,
        env: Optional[Mapping[str, str]] = None,
        cwd: Optional[str] = None,
        timeout_s: Optional[float] = None,
        name: Optional[str] = None,
    ) -> dict:
        """Start a durable process; return ``process``, ``name``, ``existing`` and ``running``.

        The process outlives this call, this client and its connection, until
        it ends, is signalled or its sandbox ends; ``timeout_s`` is its budget
        (none by default). A ``name`` that already names a process of the
        sandbox (running or ended) starts nothing and returns that process
        with ``existing`` True. So a start with a name is sent again after a
        broken connection (it cannot start twice); one without is not.
        """
        return self.call(
            "start_command",
            {
                "sandbox": sandbox,
                "command": command,
                "argv": list(argv) if argv is not None else None,
                "stdin": bytes(stdin) if stdin is not None else None,
                "env": _opt_map(env),
                "cwd": cwd,
                "timeout_s": timeout_s,
                "name": name,
            },
            idempotent=name is not None,
        )

    def read_output(
        self,
        sandbox: str,
        process: str,
        *,
        stream: str = "stdout",
        offset: int = 0,
        max_bytes: Optional[int] = None,
        wait_s: Optional[float] = None,
    ) -> dict:
        """One stream of a durable process from byte ``offset`` (counted from its start).

        Returns ``data``, ``offset`` (where ``data`` starts: ``offset``, or the
        oldest byte still kept), ``dropped`` (the bytes between them that are
        gone), ``next_offset``, ``running``, and once it ended ``exit_code`` and
        ``reason``. With ``wait_s`` the daemon waits up to that long (at most
        600 s) for bytes at ``offset`` or the end when there are none yet.
        """
        return self.call(
            "read_output",
            {
                "sandbox": sandbox,
                "process": process,
                "stream": stream,
                "offset": offset,
                "max_bytes": max_bytes,
                "wait_s": wait_s,
            },
            timeout=self.op_timeout + _seconds(wait_s),
        )

    def follow_output(
        self,
        sandbox: str,
        process: str,
        *,
        stream: str = "stdout",
        offset: int = 0,
        wait_s: float = 30.0,
        max_bytes: Optional[int] = None,
        reconnect_timeout: float = 60.0,
        on_dropped: Optional[Callable[[int, int], None]] = None,
    ) -> OutputFollower:
        """An iterator over ``stream``'s bytes from ``offset`` until the process ends.

        It yields ``bytes`` chunks as the process writes them (each read waits
        up to ``wait_s`` on the daemon) and stops once the process ended and
        everything it wrote was read; its ``exit_code`` and ``reason`` then say
        how it ended. A broken connection, or a daemon away for up to
        ``reconnect_timeout`` seconds, is survived: the follower reads again
        from the last ``next_offset``, so nothing is lost or repeated. See
        :class:`~sandbox_sidecar.processes.OutputFollower`.
        """
        return OutputFollower(
            lambda at, wait: self.read_output(
                sandbox, process, stream=stream, offset=at, max_bytes=max_bytes, wait_s=wait
            ),
            offset=offset,
            wait_s=wait_s,
            reconnect_timeout=reconnect_timeout,
            on_dropped=on_dropped,
            what=f"process {process} of sandbox {sandbox} ({stream})",
        )

    def wait_process(self, sandbox: str, process: str, *, timeout_s: Optional[float] = None) -> dict:
        """Wait up to ``timeout_s`` (at most 600 s; ``None``: not at all) for a durable process's end.

        Returns the process as ``list_processes`` describes one: ``running``
        still True at the timeout, else ``exit_code`` (128+N for signal N),
        ``reason``, ``started_at``, ``ended_at``, ``stdout_bytes``, ``stderr_bytes``.
        """
        return self.call(
            "wait_process",
            {"sandbox": sandbox, "process": process, "timeout_s": timeout_s},
            timeout=self.op_timeout + _seconds(timeout_s),
        )

    def signal_process(self, sandbox: str, process: str, signal: str = "TERM") -> None:
        """Send ``signal`` (``TERM``, ``KILL``, ``INT``, ``HUP``, ``USR1``, ``USR2``) to the process's group.

        A process that has ended is the error ``process_ended``. Not sent again
        after a broken connection: a second signal is not always harmless.
        """
        self.call("signal_process", {"sandbox": sandbox, "process": process, "signal": signal})

    def list_processes(self, sandbox: str) -> List[dict]:
        """Every durable process the sandbox keeps a record of, oldest first (maps as ``wait_process``'s)."""
        return list(self.call("list_processes", {"sandbox": sandbox}).get("processes") or [])

    # -- code contexts -----------------------------------------------------------

    def run_code(
        self,
        sandbox: str,
        code: str,
        *,
        context: Optional[str] = None,
        timeout_s: Optional[float] = None,
        max_output_bytes: Optional[int] = None,
        on_output: Optional[Callable[[str, bytes], None]] = None,
    ) -> dict:
        """Run a cell of Python in one of the sandbox's code contexts; return the daemon's result map.

        ``context`` names the context (made on first use; ``None``: the
        daemon's ``"default"``), whose variables persist from one cell to the
        next. The result has ``stdout``/``stderr`` (bytes, the kept tails),
        ``results`` (MIME bundles), ``error``, ``execution_count``,
        ``duration_s``, ``timed_out``, ``context_lost``, ``oom_killed`` and
        ``reason``. ``on_output`` streams the output as for :meth:`run_command`.
        Never sent again after a broken connection: the cell would run twice.
        """
        budget = timeout_s
        if budget is None:
            budget = self.limits.get("default_timeout_s") or self.op_timeout
        return self.call(
            "run_code",
            {
                "sandbox": sandbox,
                "code": code,
                "context": context,
                "timeout_s": timeout_s,
                "max_output_bytes": max_output_bytes,
                "stream": True if on_output is not None else None,
            },
            timeout=budget,
            on_event=on_output,
        )

    def list_contexts(self, sandbox: str) -> List[dict]:
        """The sandbox's code contexts, by name: maps with ``context``, ``running`` and ``execution_count``."""
        return list(self.call("list_contexts", {"sandbox": sandbox}).get("contexts") or [])

    def restart_context(self, sandbox: str, context: str) -> None:
        """End the context's process and state and keep it: listed at ``execution_count`` 0, its next cell starts afresh.

        An unknown context is the error ``context_not_found``.
        """
        self.call("restart_context", {"sandbox": sandbox, "context": context})

    def delete_context(self, sandbox: str, context: str) -> None:
        """End the context: its process and its state. An unknown one is the error ``context_not_found``."""
        self.call("delete_context", {"sandbox": sandbox, "context": context})

    # -- snapshots and forks -----------------------------------------------------

    def snapshot(self, sandbox: str, name: str, *, memory: bool = False, timeout: Optional[float] = None) -> dict:
        """Make the sandbox's files (its image, ``/workspace`` and ``/tmp``) the image ``name``.

        Later sandboxes created with ``image=name`` start with those files.
        Returns ``image``, ``digest``, ``size_bytes``, ``files``, ``base_image``,
        ``frozen`` (its processes were stopped while its files were copied)
        and ``duration_ms``. A taken name is the error ``image_exists``, a full
        disk ``no_space`` (nothing is kept, the sandbox is as it was).
        ``memory=True`` keeps its processes and their memory too (gVisor
        only; elsewhere ``not_supported``): sandboxes created from the image
        start with them, and ``/tmp/.sandbox-restored`` in each.
        """
        return self.call("snapshot", {"sandbox": sandbox, "name": name, "memory": memory or None}, timeout=timeout)

    def fork(
        self,
        sandbox: str,
        count: int = 1,
        *,
        owner: Optional[str] = None,
        ttl_s: Optional[float] = None,
        memory: bool = False,
        timeout: Optional[float] = None,
    ) -> dict:
        """Make ``count`` (1..16) new sandboxes as copies of ``sandbox``: its files now, its spec, its owner and lease.

        ``owner`` and ``ttl_s`` give the forks others. All or nothing: a fork
        the quotas cannot take whole is the error ``quota_exceeded`` and makes
        none. ``memory=True`` copies the processes and their memory too
        (gVisor only; elsewhere ``not_supported``). Returns ``sandboxes``
        (their ids), ``expires_at`` and ``frozen``.
        """
        return self.call(
            "fork",
            {"sandbox": sandbox, "count": count, "owner": owner, "ttl_s": ttl_s, "memory": memory or None},
            timeout=timeout,
        )


    # -- paused sandboxes --------------------------------------------------------

    def pause(self, sandbox: str, *, timeout: Optional[float] = None) -> dict:
        """Stop every process of the sandbox where it is, until it is used or resumed.

        A paused sandbox uses no CPU (on gVisor its memory goes back to the
        host too: ``memory_released``) and keeps its files, processes, code
        contexts, owner and lease; any later use of it (a command, a file, a
        process, a cell, an ``attach``) resumes it first. Returns ``sandbox``,
        ``state`` (``"paused"``), ``paused_at``, ``memory_released``,
        ``expires_at`` and ``remaining_s``. A sandbox running a command is
        the error ``busy`` (pause it once the command ended); a daemon that
        cannot pause says ``not_supported``. Pausing a paused sandbox
        changes nothing.
        """
        return self.call("pause", {"sandbox": sandbox}, timeout=timeout)

    def resume(self, sandbox: str, *, timeout: Optional[float] = None) -> dict:
        """Let a paused sandbox's processes go on where they were.

        Returns what :meth:`pause` does, with ``state`` ``"ready"``. Resuming
        a running sandbox changes nothing.
        """
        return self.call("resume", {"sandbox": sandbox}, timeout=timeout)


def check_timeouts(*, connect_timeout: float, op_timeout: float, grace: float) -> None:
    """Raise ValueError unless the timeouts are usable (positive and finite; grace may be 0)."""
    for name, value in (("connect_timeout", connect_timeout), ("op_timeout", op_timeout)):
        if not _positive_finite(value):
            raise ValueError(f"{name} must be a positive finite number, got {value!r}")
    if not (_positive_finite(grace) or grace == 0):
        raise ValueError(f"grace must be a finite number >= 0, got {grace!r}")


def _positive_finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0


def _seconds(value: Optional[float]) -> float:
    """A wait's length as a budget: 0 for none (or nonsense, which the daemon refuses)."""
    return float(value) if _positive_finite(value) else 0.0


def _opt_map(value: Optional[Mapping[str, str]]) -> Optional[Dict[str, str]]:
    return dict(value) if value is not None else None
