"""Client for the sandbox-sidecar daemon, and an Apache Airflow sandbox backend built on it.

- :class:`SidecarClient` speaks the wire protocol (docs/protocol.md) over the
  daemon's Unix socket.
- :class:`SidecarSandboxBackend` is the drop-in Airflow ``SandboxBackend``
  (``name = "sidecar"``). With ``apache-airflow-providers-common-ai`` installed
  it is upstream's ``AttachableSandboxBackend`` and raises upstream's errors;
  without it, the same-named classes re-exported here stand in.
- :class:`PythonTool` is an agent's ``run_python`` tool (Python whose state
  lasts between calls); ``sandbox_sidecar.toolset.SidecarSandboxToolset``,
  importable where the provider is, puts it beside ``SandboxToolset``'s tools.
"""

from __future__ import annotations

from .backend import (
    ERROR_KINDS,
    HOST_SEPARATOR,
    MODEL,
    RESOURCE_KEYS,
    TERMINAL,
    SidecarSandboxBackend,
    check_resources,
    labels_from_context,
    split_handle,
    to_sandbox_error,
)
from .client import DEFAULT_SOCKET_PATH, SOCKET_ENV_VAR, SidecarClient, resolve_socket_path
from .code import DEFAULT_CONTEXT, SidecarCodeError, SidecarCodeResult, SidecarContextInfo
from .contract import (
    UPSTREAM,
    AttachableSandboxBackend,
    AttachedSandbox,
    SandboxBackend,
    SandboxError,
    SandboxExecResult,
    SandboxFileTooLargeError,
    SandboxSpec,
    SandboxTerminalError,
    SidecarExecResult,
)
from .errors import SidecarConnectionError, SidecarError, SidecarProtocolError, SidecarTimeoutError
from .processes import OutputFollower, SidecarOutput, SidecarProcess, SidecarProcessInfo
from .tools import RUN_PYTHON, PythonTool, render_code_result

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_CONTEXT",
    "DEFAULT_SOCKET_PATH",
    "ERROR_KINDS",
    "HOST_SEPARATOR",
    "MODEL",
    "RESOURCE_KEYS",
    "RUN_PYTHON",
    "SOCKET_ENV_VAR",
    "TERMINAL",
    "UPSTREAM",
    "AttachableSandboxBackend",
    "AttachedSandbox",
    "OutputFollower",
    "PythonTool",
    "SandboxBackend",
    "SandboxError",
    "SandboxExecResult",
    "SandboxFileTooLargeError",
    "SandboxSpec",
    "SandboxTerminalError",
    "SidecarClient",
    "SidecarCodeError",
    "SidecarCodeResult",
    "SidecarConnectionError",
    "SidecarContextInfo",
    "SidecarError",
    "SidecarExecResult",
    "SidecarOutput",
    "SidecarProcess",
    "SidecarProcessInfo",
    "SidecarProtocolError",
    "SidecarSandboxBackend",
    "SidecarTimeoutError",
    "check_resources",
    "labels_from_context",
    "render_code_result",
    "resolve_socket_path",
    "split_handle",
    "to_sandbox_error",
]
