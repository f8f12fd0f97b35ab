"""``SidecarSandboxToolset``: upstream's ``SandboxToolset`` with ``run_python``, against the real daemon.

The provider and pydantic-ai are not installed here, so, as in
``test_upstream.py``, a stand-in with their module layout is written to a
temp dir and a child interpreter imports it. The stand-in ``SandboxToolset``
has the shape of upstream's (apache/airflow 0526b698,
``providers/common/ai/src/airflow/providers/common/ai/toolsets/sandbox.py``):
its constructor's arguments, ``for_run`` building a fresh instance from
them, ``_ensure_sandbox`` provisioning lazily, ``get_tools`` answering
``ToolsetTool``s of ``ToolDefinition``s and ``call_tool``; its bodies are
minimal and its own. Everything behind it (the backend, the daemon, the
sandbox and its code context) is real.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from test_upstream import BASE, INIT

SRC = Path(__file__).resolve().parents[1] / "src"

pytestmark = pytest.mark.integration

STANDIN = {
    "pydantic_ai/__init__.py": "",
    "pydantic_ai/exceptions.py": """
class ModelRetry(Exception):
    def __init__(self, message):
        self.message = message
        super().__init__(message)
""",
    "pydantic_ai/tools.py": """
from dataclasses import dataclass
from typing import Any, Optional

@dataclass
class ToolDefinition:
    name: str
    parameters_json_schema: Any
    description: Optional[str] = None
    sequential: bool = False
    return_schema: Any = None
""",
    "pydantic_ai/toolsets/__init__.py": "",
    "pydantic_ai/toolsets/abstract.py": """
from dataclasses import dataclass
from typing import Any

class AbstractToolset:
    async def for_run(self, ctx):
        return self

@dataclass
class ToolsetTool:
    toolset: Any
    tool_def: Any
    max_retries: int
    args_validator: Any
""",
    "airflow/providers/common/ai/utils/__init__.py": "",
    "airflow/providers/common/ai/utils/tool_definition.py": """
class _Required:
    def __init__(self, required):
        self.required = required
    def validate_python(self, args):
        missing = [k for k in self.required if k not in args]
        if missing:
            raise ValueError(f"missing {missing}")
        return args

def build_args_validator(schema):
    return _Required(schema.get("required", []))

def return_schema_kwargs(schema):
    return {"return_schema": schema}
""",
    "airflow/providers/common/ai/toolsets/__init__.py": "",
    "airflow/providers/common/ai/toolsets/sandbox.py": """
import asyncio
from pydantic_ai.tools import ToolDefinition
from pydantic_ai.toolsets.abstract import AbstractToolset, ToolsetTool
from airflow.providers.common.ai.sandbox.base import SandboxSpec
from airflow.providers.common.ai.utils.tool_definition import build_args_validator, return_schema_kwargs

_SCHEMAS = {
    "run_command": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
    "read_file": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
    "write_file": {"type": "object", "properties": {"path": {"type": "string"}, "content": {"type": "string"}}, "required": ["path", "content"]},
    "list_directory": {"type": "object", "properties": {"path": {"type": "string"}}, "required": []},
}

class SandboxToolset(AbstractToolset):
    def __init__(self, backend, *, spec=None, default_command_timeout=60.0, max_command_timeout=300.0,
                 max_output_lines=2000, max_output_bytes=50 * 1024, max_read_bytes=5 * 1024 * 1024,
                 tool_prefix="", attach_to=None, owner=None):
        self._backend = backend
        self._spec = spec if spec is not None else SandboxSpec()
        self._args = dict(default_command_timeout=default_command_timeout, max_command_timeout=max_command_timeout,
                          max_output_lines=max_output_lines, max_output_bytes=max_output_bytes,
                          max_read_bytes=max_read_bytes, tool_prefix=tool_prefix)
        self._tool_prefix = tool_prefix
        self._sandbox = None

    async def for_run(self, ctx):
        return type(self)(self._backend, spec=self._spec, **self._args)

    def _tool_name(self, base):
        return f"{self._tool_prefix}_{base}" if self._tool_prefix else base

    def _network_note(self):
        return "This sandbox has NO network access."

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc_info):
        sandbox, self._sandbox = self._sandbox, None
        if sandbox is not None:
            await asyncio.to_thread(self._backend.destroy, sandbox)

    async def _ensure_sandbox(self):
        if self._sandbox is None:
            self._sandbox = await asyncio.to_thread(self._backend.create, spec=self._spec)
        return self._sandbox

    async def get_tools(self, ctx):
        tools = {}
        for base, schema in _SCHEMAS.items():
            name = self._tool_name(base)
            tool_def = ToolDefinition(name=name, description=base, parameters_json_schema=schema, sequential=True,
                                      **return_schema_kwargs({"type": "string"}))
            tools[name] = ToolsetTool(toolset=self, tool_def=tool_def, max_retries=2, args_validator=build_args_validator(schema))
        return tools

    async def call_tool(self, name, tool_args, ctx, tool):
        sandbox = await self._ensure_sandbox()
        if name != self._tool_name("run_command"):
            raise AssertionError("the stand-in runs only run_command")
        result = await asyncio.to_thread(self._backend.run_command, sandbox, tool_args["command"],
                                         timeout=self._args["default_command_timeout"],
                                         max_output_bytes=self._args["max_output_bytes"])
        return f"[stdout]\\n{result.stdout}"
""",
}

CHECK = r'''
import asyncio, os
import sandbox_sidecar as s
from sandbox_sidecar.tools import RUN_PYTHON_SCHEMA
from sandbox_sidecar.toolset import SidecarSandboxToolset
from airflow.providers.common.ai.toolsets.sandbox import SandboxToolset
from pydantic_ai.exceptions import ModelRetry

assert s.UPSTREAM and issubclass(SidecarSandboxToolset, SandboxToolset)
backend = s.SidecarSandboxBackend(os.environ["SOCKET"])
images = os.environ["IMAGES"]
toolset = SidecarSandboxToolset(backend, spec=s.SandboxSpec(), default_command_timeout=20, image_dir=images)
kept = os.path.join(images, "default-3-1.png")
PICTURE = "class P:\n    def _repr_png_(self): return b'\\x89PNG'\n    def __repr__(self): return '<P>'\nP()"


async def main():
    run = await toolset.for_run(None)
    assert type(run) is SidecarSandboxToolset and run is not toolset
    tools = await run.get_tools(None)
    assert sorted(tools) == ["list_directory", "read_file", "run_command", "run_python", "write_file"], sorted(tools)
    py = tools["run_python"]
    assert py.toolset is run and py.max_retries == 2
    assert py.tool_def.name == "run_python" and py.tool_def.sequential
    assert py.tool_def.parameters_json_schema == RUN_PYTHON_SCHEMA
    assert py.tool_def.return_schema == {"type": "string"}
    assert py.tool_def.description.startswith("Run Python code in a persistent interpreter")
    assert py.tool_def.description.endswith("This sandbox has NO network access.")
    assert py.args_validator.validate_python({"code": "1"}) == {"code": "1"}
    async with run:
        # State between the model's calls; the same sandbox as run_command's.
        out = await run.call_tool("run_python", {"code": "rows = [1, 2, 3]\nopen('rows.txt', 'w').write(str(rows))\nlen(rows)"}, None, py)
        assert out == "[result]\n3", out
        out = await run.call_tool("run_python", {"code": "sum(rows)", "timeout_seconds": 10}, None, py)
        assert out == "[result]\n6", out
        out = await run.call_tool("run_command", {"command": "cat rows.txt"}, None, tools["run_command"])
        assert out == "[stdout]\n[1, 2, 3]", out
        out = await run.call_tool("run_python", {"code": PICTURE}, None, py)
        assert out == f"[result]\n<P>\n[an image was made (image/png, 4 B); kept as {kept}]", out
        for bad in ({"code": "1", "timeout_seconds": -1}, {"code": 5}, {}):
            try:
                await run.call_tool("run_python", bad, None, py)
            except ModelRetry as exc:
                assert str(exc).startswith("The run_python tool failed: "), exc
            else:
                raise AssertionError(f"{bad} was run")
        sandbox = run._sandbox
    assert toolset.images == [kept] and open(kept, "rb").read() == b"\x89PNG"
    try:
        backend.run_code(sandbox, "1")
    except s.SandboxTerminalError as exc:
        assert exc.code == "not_found", exc.code
    else:
        raise AssertionError("the run's sandbox outlived it")

    prefixed = SidecarSandboxToolset(backend, tool_prefix="py", python_context="other")
    names = sorted(await (await prefixed.for_run(None)).get_tools(None))
    assert names == ["py_list_directory", "py_read_file", "py_run_command", "py_run_python", "py_write_file"], names
    try:
        SidecarSandboxToolset(object())
    except ValueError as exc:
        assert "needs a backend with code contexts" in str(exc)
    else:
        raise AssertionError("a backend without run_code was taken")


asyncio.run(main())
backend.close()
print("ok")
'''


def test_run_python_beside_the_toolsets_own_tools(sidecar_daemon, tmp_path):
    root = tmp_path / "standin"
    files = dict(STANDIN)
    files["airflow/providers/common/ai/sandbox/base.py"] = BASE.replace("{extra_field}", "applied_timeout: Optional[float] = None")
    files["airflow/providers/common/ai/sandbox/__init__.py"] = INIT
    for name in ("airflow", "airflow/providers", "airflow/providers/common", "airflow/providers/common/ai"):
        files[f"{name}/__init__.py"] = ""
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    proc = subprocess.run(
        [sys.executable, "-c", CHECK],
        env={"PYTHONPATH": f"{root}:{SRC}", "PATH": "/usr/bin:/bin", "SOCKET": sidecar_daemon.socket, "IMAGES": str(tmp_path / "images")},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok"


def test_without_the_provider_the_toolset_says_what_is_missing():
    proc = subprocess.run(
        [sys.executable, "-c", "import sandbox_sidecar.toolset"],
        env={"PYTHONPATH": str(SRC), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode != 0
    assert "ImportError: sandbox_sidecar.toolset builds on the SandboxToolset of apache-airflow-providers-common-ai" in proc.stderr
    assert "sandbox_sidecar.tools.PythonTool" in proc.stderr
    # The package itself never needs the provider.
    plain = subprocess.run(
        [sys.executable, "-c", "import sandbox_sidecar, sandbox_sidecar.tools; print(sandbox_sidecar.UPSTREAM)"],
        env={"PYTHONPATH": str(SRC), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert plain.returncode == 0 and plain.stdout.strip() == "False", plain.stderr
