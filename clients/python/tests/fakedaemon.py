"""A scriptable stand-in for the daemon on a real Unix socket, for unit tests.

Each accepted connection runs ``script(session)`` in its own thread. A session
reads and writes frames as the protocol says; ``serve`` answers requests from a
table of op handlers, so a test only scripts what it is about.
"""

from __future__ import annotations

import os
import shutil
import socket
import socketserver
import struct
import tempfile
import threading
from typing import Any, Callable, Dict, List, Optional

import msgpack

LIMITS = {
    "max_frame_bytes": 16 << 20,
    "max_output_bytes": 4 << 20,
    "default_output_bytes": 1 << 20,
    "max_file_bytes": 8 << 20,
    "max_timeout_s": 3600.0,
    "default_timeout_s": 120.0,
    "max_list_entries": 10000,
}


class OpError(Exception):
    """Raise from an op handler to answer with an error response."""

    def __init__(self, code: str, message: str = "", **details: Any) -> None:
        super().__init__(code)
        self.code = code
        self.message = message or code
        self.details = details


class Session:
    def __init__(self, daemon: "FakeDaemon", sock: socket.socket, index: int) -> None:
        self.daemon = daemon
        self.sock = sock
        self.index = index  # 0 for the first connection, 1 for the second...
        self.send_lock = threading.Lock()

    # -- raw ---------------------------------------------------------------------

    def recv_exact(self, n: int) -> Optional[bytes]:
        buf = b""
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                return None
            buf += chunk
        return buf

    def recv(self) -> Optional[dict]:
        """The next request, or None when the client closed the connection."""
        header = self.recv_exact(4)
        if header is None:
            return None
        (n,) = struct.unpack(">I", header)
        body = self.recv_exact(n)
        if body is None:
            return None
        message = msgpack.unpackb(body, raw=False)
        self.daemon.log(self.index, message)
        return message

    def send_raw(self, data: bytes) -> None:
        with self.send_lock:
            self.sock.sendall(data)

    def send(self, message: Dict[str, Any]) -> None:
        body = msgpack.packb(message, use_bin_type=True)
        self.send_raw(struct.pack(">I", len(body)) + body)

    # -- envelopes ---------------------------------------------------------------

    def ok(self, request: dict, result: Optional[dict] = None) -> None:
        self.send({"v": 1, "id": request["id"], "ok": True, "result": result or {}})

    def fail(self, request_id: int, code: str, message: str = "", **details: Any) -> None:
        error = {"code": code, "message": message or code, **details}
        self.send({"v": 1, "id": request_id, "ok": False, "error": error})

    def answer_hello(self, limits: Optional[dict] = None) -> dict:
        request = self.recv()
        assert request is not None and request["op"] == "hello", request
        self.ok(request, {"version": 1, "backend": "fake", "limits": {**LIMITS, **(limits or {})}})
        return request

    def serve(self, ops: Dict[str, Callable[[dict], Optional[dict]]], *, limits: Optional[dict] = None) -> None:
        """Answer hello, then every request from ``ops`` (op name -> handler(args) -> result)."""
        self.answer_hello(limits)
        while True:
            request = self.recv()
            if request is None:
                return
            handler = ops.get(request["op"])
            if handler is None:
                self.fail(request["id"], "unknown_op", f"no op {request['op']}")
                continue
            try:
                result = handler(request.get("args") or {})
            except OpError as exc:
                self.fail(request["id"], exc.code, exc.message, **exc.details)
            else:
                self.ok(request, result)


class FakeDaemon:
    def __init__(self, script: Callable[[Session], None]) -> None:
        self.script = script
        self.dir = tempfile.mkdtemp(prefix="ssc-fake-")
        self.path = os.path.join(self.dir, "s.sock")
        self.requests: List[tuple] = []  # (connection index, request) in arrival order
        self.connections = 0
        self._lock = threading.Lock()
        self.errors: List[BaseException] = []
        daemon = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                with daemon._lock:
                    index = daemon.connections
                    daemon.connections += 1
                try:
                    daemon.script(Session(daemon, self.request, index))
                except (BrokenPipeError, ConnectionResetError):
                    pass
                except BaseException as exc:  # surfaced by the fixture
                    daemon.errors.append(exc)

        class Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
            daemon_threads = True

        self.server = Server(self.path, Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def log(self, index: int, request: dict) -> None:
        with self._lock:
            self.requests.append((index, request))

    def ops_seen(self) -> List[str]:
        with self._lock:
            return [r["op"] for _, r in self.requests]

    def args_of(self, op: str) -> List[dict]:
        with self._lock:
            return [r.get("args") or {} for _, r in self.requests if r["op"] == op]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        shutil.rmtree(self.dir, ignore_errors=True)
