"""``run_python`` (sandbox_sidecar.tools): the model's code in a persistent context, rendered for the model.

Against the real daemon (bwrap backend), but for the rendering's bounds,
which are a pure function of a result.
"""

from __future__ import annotations

import pytest

from sandbox_sidecar import SandboxError, SandboxSpec, SidecarCodeError, SidecarCodeResult
from sandbox_sidecar.tools import PythonTool, render_code_result

from test_code import PICTURE


@pytest.fixture
def sandbox(backend):
    handle = backend.create(spec=SandboxSpec(), ttl_s=600)
    yield handle
    backend.destroy(handle)


@pytest.mark.integration
def test_run_python_renders_for_a_model_and_keeps_images(backend, sandbox, tmp_path):
    tool = PythonTool(backend, context="agent", default_timeout=30, max_timeout=60, image_dir=str(tmp_path / "out"))
    assert tool.run(sandbox, "import csv, io\nrows = list(csv.DictReader(io.StringIO('x,y\\n1,2\\n2,4\\n')))\nprint(len(rows), 'rows')") == "[stdout]\n2 rows"
    assert tool.run(sandbox, "[float(r['y']) / float(r['x']) for r in rows]") == "[result]\n[2.0, 2.0]"
    shown = tool.run(sandbox, PICTURE + "display(Picture())\n'drawn'")
    kept = str(tmp_path / "out" / "agent-3-1.png")
    assert shown.startswith("[result 1 of 2]\n<Picture>\n")
    assert "[also rendered as text/html, 14 B; its text is shown above]" in shown
    assert f"[an image was made (image/png, 1.0 KiB); kept as {kept}]" in shown
    assert shown.endswith("[result 2 of 2]\n'drawn'")
    assert tool.kept == [kept] and open(kept, "rb").read().startswith(b"\x89PNG")
    failed = tool.run(sandbox, "rows[10]")
    assert failed.startswith("[error]\nTraceback") and failed.endswith("IndexError: list index out of range")
    slow = tool.run(sandbox, "import time\ntime.sleep(30)", timeout_seconds=1)
    assert slow.endswith("[timed out after 1s: the code was interrupted; the variables it had set so far are kept]")
    assert tool.run(sandbox, "len(rows)") == "[result]\n2"
    assert tool.run(sandbox, "x = 1") == "(no output)"
    with pytest.raises(SandboxError):
        tool.run(sandbox, "1", timeout_seconds=-1)
    with pytest.raises(SandboxError):
        tool.run(sandbox, None)


def test_render_bounds_what_the_model_reads():
    noisy = SidecarCodeResult(
        context="c",
        stdout="".join(f"line {i}\n" for i in range(100)),
        stderr="",
        results=[{"text/plain": "v" * 50, "text/html": "<table/>"}],
        error=SidecarCodeError("MemoryError", "", ("Traceback (most recent call last):\n", "MemoryError\n")),
        timed_out=True,
        context_lost=True,
        oom_killed=True,
        reason="oom_killed",
        stdout_truncated=True,
        results_truncated=True,
    )
    assert render_code_result(noisy, timeout=5, max_output_bytes=40, max_output_lines=10) == (
        "[stdout]\n[... earlier output cut: over 10 lines or 40 B ...]\nline 96\nline 97\nline 98\nline 99\n"
        "[result]\n" + "v" * 40 + "\n[... the rest cut: over 10 lines or 40 B ...]\n"
        "[also rendered as text/html, 8 B; its text is shown above]\n"
        "[error]\n[... earlier output cut: over 10 lines or 40 B ...]\nMemoryError\n"
        "[The interpreter ran out of memory and was killed: every variable is gone and the next call starts a "
        "fresh interpreter; load your data again] [some results were left out: too many, or too large]"
    )
    # Lines first: the last 3 of the stream, the first 3 of a value.
    lines = SidecarCodeResult(context="c", stdout="a\nb\nc\nd\n", stderr="", results=[{"text/plain": "1\n2\n3\n4"}])
    assert render_code_result(lines, max_output_lines=3) == (
        "[stdout]\n[... earlier output cut: over 3 lines or 50.0 KiB ...]\nb\nc\nd\n"
        "[result]\n1\n2\n3\n[... the rest cut: over 3 lines or 50.0 KiB ...]"
    )
    lost = SidecarCodeResult(context="c", stdout="", stderr="", timed_out=True, context_lost=True, reason="timed_out")
    assert render_code_result(lost, timeout=2) == (
        "(no output)\n[The code timed out after 2s and the interpreter did not stop when interrupted, so it was "
        "killed: every variable is gone and the next call starts a fresh interpreter; load your data again]"
    )
