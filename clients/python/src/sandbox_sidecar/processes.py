"""Durable processes: what the daemon's ``start_command`` and the ops around it answer, and a follower.

A durable process outlives the call that started it, its client and its
connection; its output is kept on the host and read back by absolute byte
offset. :class:`OutputFollower` reads one stream from an offset to the
process's end and, because every read names its offset, carries on after a
broken connection (or a daemon that went away and came back) from exactly
where it was: nothing is lost and nothing repeated, except what the daemon's
log had already dropped (counted in :attr:`OutputFollower.dropped`).
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping, Optional, Tuple

from .errors import CLIENT_CLOSED, SidecarError

_log = logging.getLogger(__name__)

__all__ = [
    "STREAMS",
    "SIGNALS",
    "OutputFollower",
    "SidecarOutput",
    "SidecarProcess",
    "SidecarProcessInfo",
]

STREAMS = ("stdout", "stderr")
"""The streams of a process ``read_output`` reads."""

SIGNALS = ("TERM", "KILL", "INT", "HUP", "USR1", "USR2")
"""The signals ``signal_process`` sends (to the process's group)."""

# Codes after which a follower dials again and repeats its read: the
# connection broke, the daemon is restarting or full, or it did not answer.
_RECONNECT_CODES = frozenset({"connection_lost", "daemon_unreachable", "client_timeout", "shutting_down", "busy"})


@dataclass(frozen=True)
class SidecarProcess:
    """A durable process as ``start_command`` answers.

    ``existing`` is True when ``name`` already named a process of the
    sandbox (running or ended), so nothing was started. ``running`` is False
    for such a process that ended, and for a program that could not be run
    at all (its exit code, 127 or 126, and its stderr say why).
    """

    process: str
    name: str
    existing: bool
    running: bool


@dataclass(frozen=True)
class SidecarProcessInfo:
    """A durable process as ``wait_process`` and ``list_processes`` describe it.

    ``exit_code`` (128+N for signal N), ``reason`` (``exited``, ``killed``,
    ``timed_out``, ``oom_killed``, ``sandbox_terminated``) and ``ended_at``
    are ``None`` while it runs. Times are unix seconds; ``stdout_bytes`` and
    ``stderr_bytes`` count every byte each stream has had, of which the
    daemon keeps the last ``[processes] log_bytes``.
    """

    process: str
    name: str
    command: Optional[str]
    argv: Optional[Tuple[str, ...]]
    running: bool
    exit_code: Optional[int]
    reason: Optional[str]
    started_at: float
    ended_at: Optional[float]
    stdout_bytes: int
    stderr_bytes: int


@dataclass(frozen=True)
class SidecarOutput:
    """One ``read_output``: ``data`` starts at ``offset``, the next read goes on at ``next_offset``.

    ``offset`` is the offset asked for, or the oldest byte the daemon still
    keeps when older ones were dropped; ``dropped`` counts the bytes between
    the two that are gone. ``running``, and once ended ``exit_code`` and
    ``reason``, are as after the read.
    """

    data: bytes
    offset: int
    dropped: int
    next_offset: int
    running: bool
    exit_code: Optional[int]
    reason: Optional[str]


def _int(value: Any, default: Optional[int] = None) -> Optional[int]:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def _float(value: Any, default: Optional[float] = None) -> Optional[float]:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return default


def _str(value: Any) -> Optional[str]:
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", "replace")
    return value if isinstance(value, str) else None


def process_from_wire(result: Mapping[str, Any]) -> SidecarProcess:
    """``start_command``'s result as a :class:`SidecarProcess`."""
    return SidecarProcess(
        process=_str(result.get("process")) or "",
        name=_str(result.get("name")) or "",
        existing=bool(result.get("existing")),
        running=bool(result.get("running")),
    )


def process_info_from_wire(result: Mapping[str, Any]) -> SidecarProcessInfo:
    """One process of ``wait_process`` or ``list_processes`` as a :class:`SidecarProcessInfo`."""
    argv = result.get("argv")
    running = bool(result.get("running"))
    return SidecarProcessInfo(
        process=_str(result.get("process")) or "",
        name=_str(result.get("name")) or "",
        command=_str(result.get("command")) or None,
        argv=tuple(_str(a) or "" for a in argv) if isinstance(argv, (list, tuple)) and argv else None,
        running=running,
        exit_code=None if running else _int(result.get("exit_code")),
        reason=None if running else _str(result.get("reason")) or None,
        started_at=_float(result.get("started_at"), 0.0) or 0.0,
        ended_at=None if running else _float(result.get("ended_at")),
        stdout_bytes=_int(result.get("stdout_bytes"), 0) or 0,
        stderr_bytes=_int(result.get("stderr_bytes"), 0) or 0,
    )


def output_from_wire(result: Mapping[str, Any], asked: int) -> SidecarOutput:
    """``read_output``'s result as a :class:`SidecarOutput`; ``SidecarError`` when it is not one.

    ``asked`` is the offset the read asked for: a result that starts before
    it, or whose ``next_offset`` does not follow its data, would make a
    follower lose or repeat bytes, so it is refused.
    """
    data = result.get("data")
    if data is None:
        data = b""
    offset = _int(result.get("offset"))
    dropped = _int(result.get("dropped"), 0)
    next_offset = _int(result.get("next_offset"))
    if (
        not isinstance(data, (bytes, bytearray))
        or offset is None
        or next_offset is None
        or dropped is None
        or offset != asked + dropped
        or next_offset != offset + len(data)
    ):
        raise SidecarError(
            "protocol_error",
            f"the daemon answered read_output at offset {asked} with offsets that do not add up "
            f"(offset {offset!r}, dropped {dropped!r}, {len(data) if isinstance(data, (bytes, bytearray)) else '?'} bytes, "
            f"next_offset {next_offset!r})",
        )
    running = bool(result.get("running"))
    return SidecarOutput(
        data=bytes(data),
        offset=offset,
        dropped=dropped,
        next_offset=next_offset,
        running=running,
        exit_code=None if running else _int(result.get("exit_code")),
        reason=None if running else _str(result.get("reason")) or None,
    )


class OutputFollower(Iterator[bytes]):
    """Iterates over one stream of a durable process: ``bytes`` chunks, from an offset to the process's end.

    Each read waits on the daemon (``wait_s``) for bytes or the end, so
    there is no polling. After a broken connection, a daemon that is
    restarting or not reachable for a moment, or one that did not answer in
    time, it reads again from the offset it had reached, for up to
    ``reconnect_timeout`` seconds without an answer; then the last error is
    raised. Any other error (``process_not_found``, ``not_found``, ...) is
    raised at once. Errors go through ``map_error`` first.

    Bytes the daemon's log dropped before they were read (it keeps the last
    ``[processes] log_bytes`` of a stream) are skipped: they are logged,
    counted in :attr:`dropped` and passed to ``on_dropped(from_offset,
    count)``.

    Once the iteration ended, :attr:`exit_code` and :attr:`reason` say how
    the process ended; :attr:`offset` is always where the next read would
    go on (pass it to a new follower to carry on later).
    """

    def __init__(
        self,
        read: Callable[[int, float], Mapping[str, Any]],
        *,
        offset: int = 0,
        wait_s: float = 30.0,
        reconnect_timeout: float = 60.0,
        on_dropped: Optional[Callable[[int, int], None]] = None,
        map_error: Callable[[SidecarError], BaseException] = lambda exc: exc,
        what: str = "the process",
    ) -> None:
        if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
            raise ValueError(f"offset must be an integer >= 0, got {offset!r}")
        if not isinstance(wait_s, (int, float)) or isinstance(wait_s, bool) or not math.isfinite(wait_s) or wait_s <= 0:
            raise ValueError(f"wait_s must be a positive finite number of seconds, got {wait_s!r}")
        if (
            not isinstance(reconnect_timeout, (int, float))
            or isinstance(reconnect_timeout, bool)
            or not math.isfinite(reconnect_timeout)
            or reconnect_timeout < 0
        ):
            raise ValueError(f"reconnect_timeout must be a finite number of seconds >= 0, got {reconnect_timeout!r}")
        self._read = read
        self._wait_s = float(wait_s)
        self._reconnect_timeout = float(reconnect_timeout)
        self._on_dropped = on_dropped
        self._map_error = map_error
        self._what = what
        self.offset = offset
        """Where the next read goes on: the ``next_offset`` of the last read."""
        self.dropped = 0
        """Bytes skipped because the daemon's log no longer had them."""
        self.running: Optional[bool] = None
        """Whether the process ran at the last read (``None`` before the first)."""
        self.exit_code: Optional[int] = None
        self.reason: Optional[str] = None
        self.reconnects = 0
        """How many reads were repeated after a broken connection."""
        self._ended = False

    def __iter__(self) -> "OutputFollower":
        return self

    def __next__(self) -> bytes:
        while not self._ended:
            out = self._read_once()
            if out.dropped:
                self.dropped += out.dropped
                _log.warning(
                    "%s: bytes %d to %d of its output were dropped by the daemon before they were read",
                    self._what,
                    out.offset - out.dropped,
                    out.offset,
                )
                if self._on_dropped is not None:
                    self._on_dropped(out.offset - out.dropped, out.dropped)
            self.offset = out.next_offset
            self.running = out.running
            if not out.running:
                self.exit_code, self.reason = out.exit_code, out.reason
            if out.data:
                return out.data
            if not out.running:
                self._ended = True
        raise StopIteration

    def _read_once(self) -> SidecarOutput:
        lost_at: Optional[float] = None
        pause = 0.1
        while True:
            try:
                return output_from_wire(self._read(self.offset, self._wait_s), self.offset)
            except SidecarError as exc:
                if exc.code not in _RECONNECT_CODES or exc.code == CLIENT_CLOSED:
                    raise self._map_error(exc) from exc
                now = time.monotonic()
                if lost_at is None:
                    lost_at = now
                    _log.warning("%s: reading its output at offset %d failed (%s); trying again", self._what, self.offset, exc)
                if now - lost_at >= self._reconnect_timeout:
                    raise self._map_error(exc) from exc
                self.reconnects += 1
                time.sleep(min(pause, max(0.0, lost_at + self._reconnect_timeout - now)))
                pause = min(pause * 2, 1.0)
