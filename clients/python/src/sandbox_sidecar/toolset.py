"""``SidecarSandboxToolset``: the ``common.ai`` provider's ``SandboxToolset`` with ``run_python`` beside its tools.

Importable only where the provider (and so pydantic-ai) is installed; the
rest of ``sandbox_sidecar`` never imports this module. The agent gets
upstream's four tools (``run_command``, ``read_file``, ``write_file``,
``list_directory``), unchanged, and a fifth, ``run_python``
(:mod:`sandbox_sidecar.tools`), whose code runs in a persistent code context
of the same sandbox: what one call loads, the next still has.
"""

from __future__ import annotations

import asyncio
from typing import Any, Dict, Optional

try:
    from airflow.providers.common.ai.toolsets.sandbox import SandboxToolset  # type: ignore[import-not-found]
    from pydantic_ai.exceptions import ModelRetry  # type: ignore[import-not-found]
    from pydantic_ai.tools import ToolDefinition  # type: ignore[import-not-found]
    from pydantic_ai.toolsets.abstract import ToolsetTool  # type: ignore[import-not-found]
except ImportError as _exc:  # pragma: no cover - the message is the point
    raise ImportError(
        "sandbox_sidecar.toolset builds on the SandboxToolset of apache-airflow-providers-common-ai "
        f"(and pydantic-ai), which cannot be imported here: {_exc}. Without them, call "
        "sandbox_sidecar.tools.PythonTool from your agent framework's own tool."
    ) from _exc

from .code import DEFAULT_CONTEXT
from .contract import SandboxError, SandboxTerminalError
from .tools import RUN_PYTHON, RUN_PYTHON_DESCRIPTION, RUN_PYTHON_SCHEMA, PythonTool

if not hasattr(SandboxToolset, "_ensure_sandbox"):  # pragma: no cover
    raise ImportError(
        "this provider's SandboxToolset has no _ensure_sandbox, which run_python needs to share the "
        "toolset's sandbox; use sandbox_sidecar.tools.PythonTool with a sandbox of your own instead"
    )

try:  # the provider's own helpers where it has them (newer providers)
    from airflow.providers.common.ai.utils.tool_definition import (  # type: ignore[import-not-found]
        return_schema_kwargs as _return_schema_kwargs,
    )
except ImportError:  # pragma: no cover - an older provider

    def _return_schema_kwargs(schema: Dict[str, Any]) -> Dict[str, Any]:
        return {}


try:
    from airflow.providers.common.ai.utils.tool_definition import (  # type: ignore[import-not-found]
        build_args_validator as _build_args_validator,
    )
except ImportError:  # pragma: no cover - an older provider: any JSON object; call_tool checks the arguments

    def _build_args_validator(schema: Dict[str, Any]) -> Any:
        from pydantic_core import SchemaValidator, core_schema  # type: ignore[import-not-found]

        return SchemaValidator(core_schema.dict_schema(core_schema.str_schema(), core_schema.any_schema()))


__all__ = ["SidecarSandboxToolset"]


class SidecarSandboxToolset(SandboxToolset):  # type: ignore[misc,valid-type]
    """Upstream's ``SandboxToolset`` plus ``run_python``: Python whose state lasts the whole agent run.

    Takes every argument of ``SandboxToolset`` (``spec``, timeouts, output
    caps, ``tool_prefix``, ``attach_to``, ...) and:

    :param python_context: the code context the model's cells run in.
    :param image_dir: a directory on the worker where every image a cell
        makes (a matplotlib figure, anything with ``_repr_png_``) is written;
        the model is told the path, and :attr:`images` lists them for the
        task. ``None``: images are only mentioned to the model.

    ``run_python`` takes ``code`` and ``timeout_seconds`` (defaulted and
    capped as ``run_command``'s) and answers as ``run_command`` does: the
    output, then each result's text, the traceback of an exception, and a
    note when the cell timed out or its interpreter was lost. Its calls and
    the other tools' use one sandbox, one at a time.
    """

    def __init__(
        self,
        backend: Any,
        *,
        python_context: str = DEFAULT_CONTEXT,
        image_dir: Optional[str] = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(backend, **kwargs)
        if not callable(getattr(backend, "run_code", None)):
            raise ValueError(
                f"run_python needs a backend with code contexts (run_code), and {type(backend).__name__} "
                "has none: use SidecarSandboxBackend, or upstream's SandboxToolset without run_python"
            )
        prefix = kwargs.get("tool_prefix") or ""
        self._python_name = f"{prefix}_{RUN_PYTHON}" if prefix else RUN_PYTHON
        # Upstream's defaults for the caps a cell shares with a command.
        self._python = PythonTool(
            backend,
            context=python_context,
            default_timeout=kwargs.get("default_command_timeout", 60.0),
            max_timeout=kwargs.get("max_command_timeout", 300.0),
            max_output_bytes=int(kwargs.get("max_output_bytes", 50 * 1024)),
            max_output_lines=int(kwargs.get("max_output_lines", 2000)),
            image_dir=image_dir,
        )

    @property
    def images(self) -> list:
        """Paths of the images written to ``image_dir`` so far, oldest first (every run of this toolset)."""
        return list(self._python.kept)

    async def for_run(self, ctx: Any) -> Any:
        # Upstream hands each run a fresh instance built from its own
        # arguments; this toolset's go with it, and so does the list of
        # images kept, which the task reads from the toolset it made.
        run = await super().for_run(ctx)
        if isinstance(run, SidecarSandboxToolset):
            run._python = self._python
            run._python_name = self._python_name
        return run

    async def get_tools(self, ctx: Any) -> Dict[str, Any]:
        tools = await super().get_tools(ctx)
        description = RUN_PYTHON_DESCRIPTION
        network_note = getattr(self, "_network_note", None)
        if callable(network_note):
            description = f"{description} {network_note()}"
        tool_def = ToolDefinition(
            name=self._python_name,
            description=description,
            parameters_json_schema=RUN_PYTHON_SCHEMA,
            # One sandbox, and cells build on what earlier calls left.
            sequential=True,
            **_return_schema_kwargs({"type": "string"}),
        )
        tools[self._python_name] = ToolsetTool(
            toolset=self,
            tool_def=tool_def,
            max_retries=2,
            args_validator=_build_args_validator(RUN_PYTHON_SCHEMA),
        )
        return tools

    async def call_tool(self, name: str, tool_args: Dict[str, Any], ctx: Any, tool: Any) -> Any:
        if name != self._python_name:
            return await super().call_tool(name, tool_args, ctx, tool)
        sandbox = await self._ensure_sandbox()
        try:
            return await asyncio.to_thread(
                self._python.run, sandbox, tool_args.get("code"), tool_args.get("timeout_seconds")
            )
        except SandboxTerminalError:
            raise  # the sandbox is gone or the daemon unusable: the task fails, Airflow retries it
        except SandboxError as exc:
            raise ModelRetry(f"The {name} tool failed: {exc}") from exc
