"""``run_python``: an agent's tool that runs Python in a persistent code context, rendered for a model.

Framework-free: :class:`PythonTool` takes a backend and a sandbox, runs the
model's code with :meth:`SidecarSandboxBackend.run_code` and returns text a
model reads, shaped as the ``SandboxToolset``'s ``run_command`` answers
(``[stdout]``, ``[stderr]``, notes in brackets). ``sandbox_sidecar.toolset``
puts it beside that toolset's own tools; any other agent framework can call
:meth:`PythonTool.run` from a tool function of its own.
"""

from __future__ import annotations

import math
import os
import re
from typing import Any, Dict, List, Mapping, Optional

from .code import DEFAULT_CONTEXT, IMAGE_TYPES, SidecarCodeResult
from .contract import SandboxError

__all__ = [
    "RUN_PYTHON",
    "RUN_PYTHON_SCHEMA",
    "RUN_PYTHON_DESCRIPTION",
    "PythonTool",
    "render_code_result",
]

RUN_PYTHON = "run_python"
"""The tool's name."""

RUN_PYTHON_SCHEMA: Dict[str, Any] = {
    "type": "object",
    "properties": {
        "code": {
            "type": "string",
            "description": "Python to run, like a notebook cell. The value of its last line is shown when it is an expression.",
        },
        "timeout_seconds": {
            "type": ["number", "null"],
            "description": "Maximum seconds the code may run. Defaults to the configured timeout.",
        },
    },
    "required": ["code"],
}
"""The JSON schema of the tool's arguments."""

RUN_PYTHON_DESCRIPTION = (
    "Run Python code in a persistent interpreter inside the sandbox, like a notebook cell. Variables, "
    "imports and loaded data stay from one call to the next, so load a file once and keep working on "
    "it in later calls instead of starting over. The output of print(), the value of the last "
    "expression and anything passed to display() come back as text; an exception comes back with its "
    "traceback, so read it and fix your code. A figure or image is not shown to you: you are told it "
    "was made and its size. The interpreter sees the same files as run_command, in the same working "
    "directory. If it is told to have lost its state, every variable is gone: run your loading code again."
)
"""The tool's description for the model."""

_KIB = 1024


def _size(n: int) -> str:
    if n < _KIB:
        return f"{n} B"
    if n < _KIB * _KIB:
        return f"{n / _KIB:.1f} KiB"
    return f"{n / (_KIB * _KIB):.1f} MiB"


def _clip(text: str, *, max_bytes: int, max_lines: int, keep: str, already: bool = False) -> str:
    """``text`` within ``max_lines`` lines and ``max_bytes`` bytes (UTF-8), with a note of what was cut.

    ``keep`` is ``"tail"`` (output and tracebacks: the end matters) or
    ``"head"`` (a value's text: its start does); a cut falls between lines
    unless the text kept is one line. ``already`` says bytes were cut before
    this (the daemon kept a tail). The text's last newline is left out.
    """
    lines = text.splitlines(keepends=True)
    cut_lines = max(0, len(lines) - max_lines)
    if cut_lines:
        lines = lines[-max_lines:] if keep == "tail" else lines[:max_lines]
    data = "".join(lines).encode("utf-8", "surrogateescape")
    cut_bytes = max(0, len(data) - max_bytes)
    if cut_bytes:
        data = data[-max_bytes:] if keep == "tail" else data[:max_bytes]
        # Whole lines, unless that leaves nothing (one long line).
        if keep == "tail" and b"\n" in data[:-1]:
            data = data[data.index(b"\n") + 1 :]
        elif keep == "head" and b"\n" in data:
            data = data[: data.rindex(b"\n") + 1]
    body = data.decode("utf-8", "ignore").rstrip("\n")
    if not (cut_lines or cut_bytes or already):
        return text.rstrip("\n")
    what = "earlier output" if keep == "tail" else "the rest"
    note = f"[... {what} cut: over {max_lines} lines or {_size(max_bytes)} ...]"
    return f"{note}\n{body}" if keep == "tail" else f"{body}\n{note}"


def render_code_result(
    result: SidecarCodeResult,
    *,
    timeout: Optional[float] = None,
    max_output_bytes: int = 50 * _KIB,
    max_output_lines: int = 2000,
    kept: Optional[Mapping[int, str]] = None,
) -> str:
    """``result`` as text for a model.

    Streams and the traceback keep their ends, a result's ``text/plain``
    its start, each within ``max_output_bytes`` and ``max_output_lines``.
    A result with an image or HTML says so (its type and size) beside its
    text; ``kept`` maps a result's index to where its image was kept.
    ``timeout`` is the budget the cell had, for the note of a timeout.
    """
    kept = kept or {}

    def clip(text: str, keep: str, already: bool = False) -> str:
        return _clip(text, max_bytes=max_output_bytes, max_lines=max_output_lines, keep=keep, already=already)

    parts: List[str] = []
    if result.stdout:
        parts.append(f"[stdout]\n{clip(result.stdout, 'tail', result.stdout_truncated)}")
    if result.stderr:
        parts.append(f"[stderr]\n{clip(result.stderr, 'tail', result.stderr_truncated)}")
    many = len(result.results) > 1
    for index, bundle in enumerate(result.results):
        head = f"[result {index + 1} of {len(result.results)}]" if many else "[result]"
        lines = [head]
        plain = bundle.get("text/plain")
        if isinstance(plain, str) and plain:
            lines.append(clip(plain, "head"))
        for mime, value in bundle.items():
            if mime == "text/plain":
                continue
            size = len(value) if isinstance(value, (bytes, bytearray, str)) else None
            sized = f"{mime}, {_size(size)}" if size is not None else mime
            if mime in IMAGE_TYPES or mime == "image/svg+xml":
                where = kept.get(index)
                lines.append(f"[an image was made ({sized}); " + (f"kept as {where}]" if where else "it is not shown to you]"))
            else:
                lines.append(f"[also rendered as {sized}; its text is shown above]")
        parts.append("\n".join(lines))
    if result.error is not None:
        parts.append(f"[error]\n{clip(result.error.text, 'tail')}")
    notes: List[str] = []
    budget = f" after {timeout:g}s" if timeout is not None else ""
    if result.context_lost:
        if result.oom_killed:
            why = "The interpreter ran out of memory and was killed"
        elif result.timed_out:
            why = f"The code timed out{budget} and the interpreter did not stop when interrupted, so it was killed"
        else:
            why = "The interpreter died"
        notes.append(f"[{why}: every variable is gone and the next call starts a fresh interpreter; load your data again]")
    elif result.timed_out:
        notes.append(f"[timed out{budget}: the code was interrupted; the variables it had set so far are kept]")
    if result.results_truncated:
        notes.append("[some results were left out: too many, or too large]")
    output = "\n".join(parts) if parts else "(no output)"
    return f"{output}\n{' '.join(notes)}" if notes else output


_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


class PythonTool:
    """The ``run_python`` tool: the model's code runs in one persistent context of a sandbox.

    :param backend: a :class:`~sandbox_sidecar.SidecarSandboxBackend`.
    :param context: the code context the tool's cells run in; state is kept
        in it between calls (and between tools sharing the name).
    :param default_timeout: seconds a cell may run when the model does not say.
    :param max_timeout: the most seconds a cell may run, whatever the model asks.
    :param max_output_bytes: bytes kept of each stream and of each text shown.
    :param max_output_lines: lines kept of each.
    :param image_dir: a directory on the worker (the task's output location)
        where each image a cell makes is written, as
        ``<context>-<cell>-<n>.png``; the model is told the path. ``None``:
        images are only mentioned. :attr:`kept` lists the paths written.
    """

    name = RUN_PYTHON
    description = RUN_PYTHON_DESCRIPTION
    parameters_json_schema = RUN_PYTHON_SCHEMA

    def __init__(
        self,
        backend: Any,
        *,
        context: str = DEFAULT_CONTEXT,
        default_timeout: float = 60.0,
        max_timeout: float = 300.0,
        max_output_bytes: int = 50 * _KIB,
        max_output_lines: int = 2000,
        image_dir: Optional[str] = None,
    ) -> None:
        for label, value in (("default_timeout", default_timeout), ("max_timeout", max_timeout)):
            if not _positive_finite(value):
                raise ValueError(f"{label} must be a positive finite number of seconds, got {value!r}")
        if default_timeout > max_timeout:
            raise ValueError(f"default_timeout ({default_timeout}) must not exceed max_timeout ({max_timeout})")
        for label, value in (("max_output_bytes", max_output_bytes), ("max_output_lines", max_output_lines)):
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"{label} must be an integer greater than 0, got {value!r}")
        if not isinstance(context, str) or not context:
            raise ValueError(f"context must be a context's name (a non-empty str), got {context!r}")
        self.backend = backend
        self.context = context
        self.default_timeout = float(default_timeout)
        self.max_timeout = float(max_timeout)
        self.max_output_bytes = max_output_bytes
        self.max_output_lines = max_output_lines
        self.image_dir = os.fspath(image_dir) if image_dir is not None else None
        self.kept: List[str] = []
        """Paths of the images written to ``image_dir``, oldest first."""

    def timeout_for(self, requested: Any) -> float:
        """The cell's budget for the model's ``timeout_seconds``; ``SandboxError`` for nonsense (the model can fix it)."""
        if requested is None:
            return self.default_timeout
        if not _positive_finite(requested):
            raise SandboxError(f"timeout_seconds must be a number greater than 0, got {requested!r}")
        return min(float(requested), self.max_timeout)

    def run(self, sandbox: str, code: Any, timeout_seconds: Any = None) -> str:
        """Run the model's ``code`` in ``sandbox``'s context and return what the model reads.

        ``SandboxError`` for what the model can fix (code that is not a
        string, a bad timeout, a busy context); ``SandboxTerminalError`` as
        the backend raises it.
        """
        if not isinstance(code, str):
            raise SandboxError(f"code must be a string of Python, got {type(code).__name__}")
        timeout = self.timeout_for(timeout_seconds)
        result = self.backend.run_code(
            sandbox, code, self.context, timeout=timeout, max_output_bytes=self.max_output_bytes
        )
        return render_code_result(
            result,
            timeout=timeout,
            max_output_bytes=self.max_output_bytes,
            max_output_lines=self.max_output_lines,
            kept=self._keep_images(result),
        )

    def _keep_images(self, result: SidecarCodeResult) -> Dict[int, str]:
        if self.image_dir is None:
            return {}
        kept: Dict[int, str] = {}
        os.makedirs(self.image_dir, exist_ok=True)
        for index, bundle in enumerate(result.results):
            for mime in IMAGE_TYPES:
                data = bundle.get(mime)
                if not isinstance(data, (bytes, bytearray)):
                    continue
                ext = "png" if mime == "image/png" else "jpg"
                name = f"{_UNSAFE.sub('_', self.context)}-{result.execution_count}-{index + 1}.{ext}"
                path = os.path.join(self.image_dir, name)
                with open(path, "wb") as f:
                    f.write(data)
                kept[index] = path
                self.kept.append(path)
                break
        return kept


def _positive_finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0
