"""Print, as JSON, every wire key the Python client sends and reads, with where it does.

Run by ``wire_test.go`` beside it, which holds each key to the msgpack keys
of ``ipc/api``'s types (the one definition of the wire). Python's own
parser (``ast``) reads the sources, so formatting, comments and strings that
merely look like code do not matter. What counts as a key:

- sent to an op: the string keys of the arguments of ``<x>.call("op", ARGS)``
  and ``<x>.request("op", ARGS)``, where ARGS is a dict literal, or a name
  that the same function builds from dict literals and ``name["key"] = ...``.
  ARGS of another shape is reported as ``unresolved`` (the test fails: write
  it so that it can be checked);
- sent to some op (nested maps, such as ``create``'s ``spec``): the dict
  keys in functions named ``*_to_wire``, and module constants named
  ``*_KEYS`` (tuples of key names);
- read: ``<x>.get("key")`` and ``<x>["key"]`` wherever ``<x>`` is not one of
  :data:`NOT_WIRE`, the receivers known to hold something else. A new
  receiver that is not the wire fails the test until it is named there:
  the check fails closed, never open.

Usage: ``python3 wire_keys.py SRC_DIR`` prints ``{"sent": [...], "sent_any": [...],
"read": [...], "unresolved": [...]}``, each item ``{"key", "op", "at"}``.
"""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path
from typing import Dict, List, Optional, Set

# Receivers (the last name of the expression a key is read from) whose keys
# are not the wire's. Each says what it holds instead.
NOT_WIRE = {
    "details": "an error's details: keys per error code, documented in docs/protocol.md's error table",
    "context": "Airflow's task context",
    "policy": "the airflow_network tag's JSON: upstream Airflow's stamp format, not a msgpack map of the daemon's",
    "bundle": "a MIME bundle of run_code's results: its keys are MIME types (docs/protocol.md, Code contexts)",
    "tool_args": "a model's arguments to a tool, by the tool's JSON schema (sandbox_sidecar.tools)",
    "kwargs": "a constructor's keyword arguments (upstream SandboxToolset's), not the wire",
}


def _receiver_name(node: ast.expr) -> str:
    """The last name of an expression: ``self.client.limits`` -> ``limits``, ``f(x).get`` -> ``f``."""
    while True:
        if isinstance(node, ast.Name):
            return node.id
        if isinstance(node, ast.Attribute):
            return node.attr
        if isinstance(node, ast.Call):
            node = node.func
            continue
        if isinstance(node, ast.Subscript):
            node = node.value
            continue
        return ""


def _str_const(node: Optional[ast.AST]) -> Optional[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    return None


def _dict_keys(node: ast.Dict) -> List[str]:
    return [k for k in (_str_const(key) for key in node.keys) if k is not None]


class _Scanner(ast.NodeVisitor):
    def __init__(self, path: str) -> None:
        self.path = path
        self.sent: List[Dict[str, str]] = []
        self.sent_any: List[Dict[str, str]] = []
        self.read: List[Dict[str, str]] = []
        self.unresolved: List[Dict[str, str]] = []
        self.functions: List[ast.AST] = []

    def at(self, node: ast.AST) -> str:
        return f"{self.path}:{getattr(node, 'lineno', 0)}"

    # -- what a function builds under a name ---------------------------------

    def _built(self, function: Optional[ast.AST], name: str) -> Optional[List[str]]:
        """Keys a function puts into ``name`` (dict literals assigned, subscript stores); None if none."""
        if function is None:
            return None
        keys: List[str] = []
        found = False
        for node in ast.walk(function):
            value = None
            if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
                value = node.value
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == name:
                value = node.value
            if value is not None:
                if not isinstance(value, ast.Dict):
                    return None
                found = True
                keys += _dict_keys(value)
            if (
                isinstance(node, ast.Subscript)
                and isinstance(node.ctx, ast.Store)
                and isinstance(node.value, ast.Name)
                and node.value.id == name
            ):
                key = _str_const(node.slice)
                if key is not None:
                    keys.append(key)
        return keys if found else None

    # -- visiting ----------------------------------------------------------------

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        self.functions.append(node)
        if node.name.endswith("_to_wire"):
            for inner in ast.walk(node):
                if isinstance(inner, ast.Dict):
                    self.sent_any += [{"key": k, "op": "", "at": self.at(inner)} for k in _dict_keys(inner)]
                if isinstance(inner, ast.Subscript) and isinstance(inner.ctx, ast.Store):
                    key = _str_const(inner.slice)
                    if key is not None:
                        self.sent_any.append({"key": key, "op": "", "at": self.at(inner)})
        self.generic_visit(node)
        self.functions.pop()

    visit_AsyncFunctionDef = visit_FunctionDef  # type: ignore[assignment]

    def visit_Module(self, node: ast.Module) -> None:
        for stmt in node.body:
            if isinstance(stmt, ast.Assign) and isinstance(stmt.value, (ast.Tuple, ast.List)):
                names = [t.id for t in stmt.targets if isinstance(t, ast.Name)]
                if any(n.endswith("_KEYS") for n in names):
                    for elt in stmt.value.elts:
                        key = _str_const(elt)
                        if key is not None:
                            self.sent_any.append({"key": key, "op": "", "at": self.at(elt)})
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr in ("call", "request") and node.args:
            op = _str_const(node.args[0])
            if op is not None:
                self._sent(op, node)
        if isinstance(func, ast.Attribute) and func.attr == "get" and node.args:
            key = _str_const(node.args[0])
            if key is not None:
                self._read(func.value, key, node)
        self.generic_visit(node)

    def _sent(self, op: str, call: ast.Call) -> None:
        args = call.args[1] if len(call.args) > 1 else None
        if args is None or (isinstance(args, ast.Constant) and args.value is None):
            return
        if isinstance(args, ast.Dict):
            keys: Optional[List[str]] = _dict_keys(args)
        elif isinstance(args, ast.Name):
            keys = self._built(self.functions[-1] if self.functions else None, args.id)
        else:
            keys = None
        if keys is None:
            self.unresolved.append({"key": "", "op": op, "at": self.at(call)})
            return
        self.sent += [{"key": k, "op": op, "at": self.at(call)} for k in keys]

    def visit_Subscript(self, node: ast.Subscript) -> None:
        if isinstance(node.ctx, ast.Load):
            key = _str_const(node.slice)
            if key is not None:
                self._read(node.value, key, node)
        self.generic_visit(node)

    def _read(self, receiver: ast.expr, key: str, node: ast.AST) -> None:
        if _receiver_name(receiver) in NOT_WIRE:
            return
        self.read.append({"key": key, "op": "", "at": self.at(node)})


def scan(src: Path) -> Dict[str, List[Dict[str, str]]]:
    out: Dict[str, List[Dict[str, str]]] = {"sent": [], "sent_any": [], "read": [], "unresolved": []}
    for path in sorted(src.glob("*.py")):
        scanner = _Scanner(path.name)
        scanner.visit(ast.parse(path.read_text(), filename=str(path)))
        for field in out:
            out[field] += getattr(scanner, field)
    return out


if __name__ == "__main__":
    json.dump(scan(Path(sys.argv[1])), sys.stdout, indent=1)
    sys.stdout.write("\n")
