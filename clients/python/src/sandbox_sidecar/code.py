"""Code contexts: what the daemon's ``run_code`` and ``list_contexts`` answer, as typed results.

A code context is a Python interpreter of its sandbox whose variables persist
from one ``run_code`` to the next (docs/protocol.md, "Code contexts"). A cell's
result is its output (bounded tails, as a command's), its *results* (MIME
bundles, one per ``display(...)``, per open matplotlib figure and for the
cell's value, as a notebook shows them), its exception, and how it ended.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Tuple

__all__ = [
    "DEFAULT_CONTEXT",
    "IMAGE_TYPES",
    "SidecarCodeError",
    "SidecarCodeResult",
    "SidecarContextInfo",
    "code_result_from_wire",
    "context_info_from_wire",
]

DEFAULT_CONTEXT = "default"
"""The context a ``run_code`` without one runs in."""

IMAGE_TYPES = ("image/png", "image/jpeg")
"""The MIME types whose values are images, as bytes."""

REASON_OK = "ok"
REASON_ERROR = "error"
REASON_TIMED_OUT = "timed_out"
REASON_CONTEXT_LOST = "context_lost"
REASON_OOM_KILLED = "oom_killed"


@dataclass(frozen=True)
class SidecarCodeError:
    """A cell's exception, as a notebook reports one: its class's ``name``, its ``value`` (``str(exc)``)
    and the ``traceback``'s lines (the cell's own lines in them, each ending in a newline)."""

    name: str
    value: str
    traceback: Tuple[str, ...]

    @property
    def text(self) -> str:
        """The traceback as Python prints it (or ``"name: value"`` when there is none)."""
        if self.traceback:
            return "".join(self.traceback)
        return f"{self.name}: {self.value}" if self.value else self.name


@dataclass(frozen=True)
class SidecarCodeResult:
    """One cell's outcome.

    ``results`` are MIME bundles (dicts of MIME type to value), in order: one
    per ``display(...)`` call, one per matplotlib figure left open
    (``image/png``), then the value of the cell's last expression when it is
    not ``None``. Every bundle has ``text/plain``; ``image/png`` and
    ``image/jpeg`` are ``bytes``, ``application/json`` its value, the rest
    ``str``. ``results_truncated`` says some were left out (too many, too
    large).

    ``reason`` is the first of ``"oom_killed"``, ``"timed_out"``,
    ``"context_lost"``, ``"error"`` and ``"ok"`` that applies. A cell that
    reached its timeout was interrupted (``KeyboardInterrupt``; ``error``
    says so) and its context kept; with ``context_lost`` the context's
    process died (killed, out of memory, or it ignored the interrupt), its
    variables are gone, and its next cell starts a fresh one.
    """

    context: str
    stdout: str
    stderr: str
    results: List[Dict[str, Any]] = field(default_factory=list)
    error: Optional[SidecarCodeError] = None
    execution_count: int = 0
    duration: float = 0.0
    timed_out: bool = False
    context_lost: bool = False
    oom_killed: bool = False
    reason: str = REASON_OK
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    results_truncated: bool = False
    stdout_stream_dropped: int = 0
    stderr_stream_dropped: int = 0

    @property
    def ok(self) -> bool:
        """The cell ran to its end without an exception."""
        return self.reason == REASON_OK

    @property
    def text(self) -> Optional[str]:
        """``text/plain`` of the last result (the cell's value, when it has one), or ``None``."""
        for bundle in reversed(self.results):
            plain = bundle.get("text/plain")
            if isinstance(plain, str):
                return plain
        return None

    @property
    def images(self) -> List[Tuple[str, bytes]]:
        """``(MIME type, bytes)`` of every image among the results, in order (one per bundle at most)."""
        out: List[Tuple[str, bytes]] = []
        for bundle in self.results:
            for mime in IMAGE_TYPES:
                data = bundle.get(mime)
                if isinstance(data, (bytes, bytearray)):
                    out.append((mime, bytes(data)))
                    break
        return out


@dataclass(frozen=True)
class SidecarContextInfo:
    """One code context as ``list_contexts`` describes it: its ``context`` name, whether a cell
    is ``running`` in it, and how many cells it has run (``execution_count``)."""

    context: str
    running: bool
    execution_count: int


def _int(value: Any, default: int = 0) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def _float(value: Any) -> float:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return 0.0


def _str(value: Any) -> str:
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", "replace")
    return value if isinstance(value, str) else ""


def _bundle(value: Any) -> Optional[Dict[str, Any]]:
    """A bundle as the caller gets it: str keys, image bytes as ``bytes``; ``None`` for something else."""
    if not isinstance(value, Mapping):
        return None
    bundle: Dict[str, Any] = {}
    for mime, data in value.items():
        if isinstance(mime, (bytes, bytearray)):
            mime = bytes(mime).decode("utf-8", "replace")
        if not isinstance(mime, str):
            continue
        bundle[mime] = bytes(data) if isinstance(data, (bytearray, memoryview)) else data
    return bundle


def _error(value: Any) -> Optional[SidecarCodeError]:
    if not isinstance(value, Mapping):
        return None
    traceback = value.get("traceback")
    lines = tuple(_str(line) for line in traceback) if isinstance(traceback, (list, tuple)) else ()
    return SidecarCodeError(name=_str(value.get("name")), value=_str(value.get("value")), traceback=lines)


def code_result_from_wire(result: Mapping[str, Any], context: str) -> SidecarCodeResult:
    """``run_code``'s result (the daemon's map) as a :class:`SidecarCodeResult` of ``context``."""
    bundles = result.get("results")
    error = _error(result.get("error"))
    timed_out = bool(result.get("timed_out"))
    context_lost = bool(result.get("context_lost"))
    oom_killed = bool(result.get("oom_killed"))
    reason = _str(result.get("reason"))
    if not reason:  # every daemon that has run_code sends one; derive it the daemon's way otherwise
        for flag, name in (
            (oom_killed, REASON_OOM_KILLED),
            (timed_out, REASON_TIMED_OUT),
            (context_lost, REASON_CONTEXT_LOST),
            (error is not None, REASON_ERROR),
            (True, REASON_OK),
        ):
            if flag:
                reason = name
                break
    return SidecarCodeResult(
        context=context,
        stdout=_str(result.get("stdout")),
        stderr=_str(result.get("stderr")),
        results=[b for b in (_bundle(x) for x in bundles) if b is not None] if isinstance(bundles, (list, tuple)) else [],
        error=error,
        execution_count=_int(result.get("execution_count")),
        duration=_float(result.get("duration_s")),
        timed_out=timed_out,
        context_lost=context_lost,
        oom_killed=oom_killed,
        reason=reason,
        stdout_truncated=bool(result.get("stdout_truncated")),
        stderr_truncated=bool(result.get("stderr_truncated")),
        results_truncated=bool(result.get("results_truncated")),
        stdout_stream_dropped=_int(result.get("stdout_stream_dropped")),
        stderr_stream_dropped=_int(result.get("stderr_stream_dropped")),
    )


def context_info_from_wire(result: Mapping[str, Any]) -> SidecarContextInfo:
    """One context of ``list_contexts`` as a :class:`SidecarContextInfo`."""
    return SidecarContextInfo(
        context=_str(result.get("context")),
        running=bool(result.get("running")),
        execution_count=_int(result.get("execution_count")),
    )
