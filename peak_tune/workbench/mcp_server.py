"""`peak-tune mcp`: the workbench's steps as Model Context Protocol tools for AI agents.

JSON-RPC 2.0 over stdio, one message per line (the MCP stdio transport): initialize,
notifications/initialized, ping, tools/list and tools/call. Protocol problems (bad JSON,
unknown method or tool, arguments that do not fit the tool's schema) are JSON-RPC
errors; a step that fails (unknown checkpoint, illegal step, wrong result) is a tool
result with isError, so the agent sees why. Only protocol messages go to stdout: file
descriptor 1 is pointed at stderr while serving, so compilers, workers and logs can
never corrupt the stream.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import IO, Any

from peak_tune import __version__
from peak_tune.core import check_size_text
from peak_tune.errors import ApplyError, UserError
from peak_tune.workbench.steps import ApplyRequest, Target, Workbench, WorkbenchConfig

__all__ = ["PROTOCOL_VERSION", "McpServer", "serve_stdio"]

log = logging.getLogger(__name__)

PROTOCOL_VERSION = "2025-06-18"
_SUPPORTED = (PROTOCOL_VERSION, "2025-03-26", "2024-11-05")

PARSE_ERROR, INVALID_REQUEST, METHOD_NOT_FOUND, INVALID_PARAMS = -32700, -32600, -32601, -32602

_INSTRUCTIONS = (
    "peak-tune optimizes a kernel one natural-language transformation at a time. "
    "list_transformations shows the legal steps and their tuning parameters; "
    "apply_transformation applies one to a checkpoint (default: the current one), shows "
    "the diff, validates and times the variant against the vendor library and saves it as "
    "a checkpoint. Branch by applying from an older checkpoint; compare with "
    "compare_checkpoints and diff_checkpoints. Everything is cached: repeats are free."
)


class ProtocolError(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class ToolOutput:
    text: str
    data: dict[str, Any] | None = None


def _schema(properties: Mapping[str, Any], required: tuple[str, ...] = ()) -> dict[str, Any]:
    return {"type": "object", "properties": dict(properties), "required": list(required),
            "additionalProperties": False}


_NAME = {"type": "string", "description": "a checkpoint name, or 'seed'"}
_SIZE = {"type": "string", "description": "problem size: N or MxNxK (default: the "
                                          "checkpoint's)"}
_DTYPE = {"type": "string", "description": "float32, float64 or float16 (default: the "
                                           "checkpoint's)"}


def _tools_schemas() -> dict[str, tuple[str, dict[str, Any]]]:
    """name -> (description, input schema)."""
    return {
        "list_transformations": (
            "The transformations for the current kernel and backend: what each does, what it "
            "requires or conflicts with, and its tuning parameters with allowed values and "
            "defaults.", _schema({})),
        "apply_transformation": (
            "Apply one transformation to a checkpoint (default: the current one; 'seed' for "
            "the seed kernel), show the unified diff, validate and time the variant next to "
            "the vendor library, and save it as a checkpoint that becomes current.",
            _schema({
                "transformation": {"type": "string", "description": "its id"},
                "params": {"type": "object", "additionalProperties": {"type": "integer"},
                           "description": "tuning values by name; missing ones: the "
                                          "parent's, else the declared defaults"},
                "from": _NAME, "name": {"type": "string", "description": "new checkpoint name"},
                "sample": {"type": "integer", "description": "ask the applier afresh"},
                "size": _SIZE, "dtype": _DTYPE}, ("transformation",))),
        "list_checkpoints": ("Every checkpoint as a tree with speeds; * marks the current.",
                             _schema({})),
        "show_checkpoint": ("A checkpoint's sequence from the seed, parameters, measurements "
                            "and source.", _schema({"name": _NAME}, ("name",))),
        "diff_checkpoints": ("Unified diff between two checkpoints' sources.",
                             _schema({"a": _NAME, "b": _NAME}, ("a", "b"))),
        "compare_checkpoints": (
            "Speeds of checkpoints side by side (GFLOP/s, vendor, ratio, speed-up over the "
            "first).", _schema({"names": {"type": "array", "items": {"type": "string"},
                                          "minItems": 1}}, ("names",))),
        "evaluate": ("Validate and time a checkpoint again, optionally at another size or "
                     "dtype; the measurement is kept with it.",
                     _schema({"name": _NAME, "size": _SIZE, "dtype": _DTYPE}, ("name",))),
        "restore_checkpoint": ("Make a checkpoint (or 'seed') current: the next "
                               "apply_transformation starts there.",
                               _schema({"name": _NAME}, ("name",))),
    }


_JSON_TYPES: dict[str, type | tuple[type, ...]] = {
    "string": str, "integer": int, "object": dict, "array": list}


def _check_arguments(schema: Mapping[str, Any], arguments: Any) -> None:
    """The subset of JSON Schema the tools use: object, required, types, extra keys."""
    if not isinstance(arguments, dict):
        raise ProtocolError(INVALID_PARAMS, "arguments must be an object")
    properties = schema["properties"]
    for key in arguments:  # a misspelt name is named before the one it stands for
        if key not in properties:
            raise ProtocolError(INVALID_PARAMS, f"unknown argument {key!r} (arguments: "
                                f"{', '.join(properties) or 'none'})")
    for key in schema["required"]:
        if key not in arguments:
            raise ProtocolError(INVALID_PARAMS, f"missing argument {key!r}")
    for key, value in arguments.items():
        expected = properties[key]["type"]
        if not isinstance(value, _JSON_TYPES[expected]) or isinstance(value, bool):
            raise ProtocolError(INVALID_PARAMS, f"argument {key!r} must be a {expected}")
        items = properties[key].get("additionalProperties") or properties[key].get("items")
        members: list[Any] = list(value.values()) if isinstance(value, dict) else \
            value if isinstance(value, list) else []
        if items and not all(isinstance(v, _JSON_TYPES[items["type"]])
                             and not isinstance(v, bool) for v in members):
            raise ProtocolError(INVALID_PARAMS, f"argument {key!r}: every value must be a "
                                f"{items['type']}")


def _target(arguments: Mapping[str, Any]) -> Target:
    size = None
    if "size" in arguments:
        try:
            size = check_size_text(str(arguments["size"]))
        except ValueError as exc:
            raise UserError(str(exc)) from exc
    return Target(dtype=arguments.get("dtype"), size=size)


class McpServer:
    """Answers one JSON-RPC message at a time; holds the workbench (and its backends)."""

    def __init__(self, bench: Workbench) -> None:
        self.bench = bench
        self.schemas = _tools_schemas()
        self.handlers: dict[str, Callable[[dict[str, Any]], ToolOutput]] = {
            "list_transformations": self._list_transformations,
            "apply_transformation": self._apply,
            "list_checkpoints": self._list_checkpoints,
            "show_checkpoint": self._show,
            "diff_checkpoints": self._diff,
            "compare_checkpoints": self._compare,
            "evaluate": self._evaluate,
            "restore_checkpoint": self._restore,
        }

    def handle_line(self, line: str) -> dict[str, Any] | None:
        """The reply to one line (None for a notification or a blank line)."""
        if not line.strip():
            return None
        try:
            message = json.loads(line)
        except json.JSONDecodeError as exc:
            return _error(None, PARSE_ERROR, f"parse error: {exc}")
        if not isinstance(message, dict) or message.get("jsonrpc") != "2.0" or \
                not isinstance(message.get("method"), str):
            ident = message.get("id") if isinstance(message, dict) else None
            if isinstance(message, dict) and "method" not in message:
                return None  # a response to something we never ask: nothing to say
            return _error(ident, INVALID_REQUEST, "not a JSON-RPC 2.0 request")
        if "id" not in message:
            log.debug("notification %s", message["method"])
            return None
        try:
            result = self._dispatch(message["method"], message.get("params") or {})
        except ProtocolError as exc:
            return _error(message["id"], exc.code, str(exc))
        return {"jsonrpc": "2.0", "id": message["id"], "result": result}

    def _dispatch(self, method: str, params: Any) -> dict[str, Any]:
        if not isinstance(params, dict):
            raise ProtocolError(INVALID_PARAMS, "params must be an object")
        if method == "initialize":
            asked = params.get("protocolVersion")
            return {
                "protocolVersion": asked if asked in _SUPPORTED else PROTOCOL_VERSION,
                "capabilities": {"tools": {"listChanged": False}},
                "serverInfo": {"name": "peak-tune", "title": "peak-tune workbench",
                               "version": __version__},
                "instructions": _INSTRUCTIONS,
            }
        if method == "ping":
            return {}
        if method == "tools/list":
            return {"tools": [{"name": n, "title": n.replace("_", " "), "description": d,
                               "inputSchema": s} for n, (d, s) in self.schemas.items()]}
        if method == "tools/call":
            return self._call(params)
        raise ProtocolError(METHOD_NOT_FOUND, f"method not found: {method}")

    def _call(self, params: dict[str, Any]) -> dict[str, Any]:
        name = params.get("name")
        if name not in self.handlers:
            raise ProtocolError(INVALID_PARAMS, f"unknown tool: {name}")
        arguments = params.get("arguments") or {}
        _check_arguments(self.schemas[str(name)][1], arguments)
        try:
            output = self.handlers[str(name)](arguments)
        except (UserError, ApplyError) as exc:
            return {"content": [{"type": "text", "text": f"error: {exc}"}], "isError": True}
        except Exception as exc:  # a tool failure must not end the session
            log.exception("tool %s failed", name)
            return {"content": [{"type": "text", "text": f"internal error: {exc}"}],
                    "isError": True}
        content = [{"type": "text", "text": output.text}]
        result: dict[str, Any] = {"content": content, "isError": False}
        if output.data is not None:
            content.append({"type": "text", "text": json.dumps(output.data)})
            result["structuredContent"] = output.data
        return result

    # -------------------------------------------------------------------- tools

    def _list_transformations(self, arguments: dict[str, Any]) -> ToolOutput:
        found = self.bench.transformations()
        lines = []
        for t in found:
            params = "; ".join(f"{p.name} in {list(p.values)} default {t.default_value(p.name)[0]}"
                               for p in t.params) or "no parameters"
            lines.append(f"{t.id}: {t.summary or t.title} (requires: "
                         f"{', '.join(t.requires) or '-'}; conflicts: "
                         f"{', '.join(t.conflicts) or '-'}; {params})")
        data = {"transformations": [
            {"id": t.id, "title": t.title, "summary": t.summary, "requires": list(t.requires),
             "conflicts": list(t.conflicts),
             "params": {p.name: {"values": list(p.values),
                                 "default": t.default_value(p.name)[0]} for p in t.params}}
            for t in found]}
        return ToolOutput("\n".join(lines), data)

    def _apply(self, arguments: dict[str, Any]) -> ToolOutput:
        from peak_tune.workbench.view import apply_json, apply_text

        result = self.bench.apply(ApplyRequest(
            arguments["transformation"], dict(arguments.get("params", {})),
            arguments.get("from"), arguments.get("name"), int(arguments.get("sample", 0)),
            _target(arguments)))
        text = (result.diff or "(source unchanged)\n") + apply_text(result)
        if result.checkpoint is None:
            raise UserError(text)
        return ToolOutput(text, apply_json(result))

    def _list_checkpoints(self, arguments: dict[str, Any]) -> ToolOutput:
        from peak_tune.workbench.view import checkpoint_json, tree_text

        current = self.bench.store.current()
        checkpoints = self.bench.store.all()
        return ToolOutput(tree_text(checkpoints, current), {
            "current": current or "seed",
            "checkpoints": [checkpoint_json(c, current) for c in checkpoints]})

    def _show(self, arguments: dict[str, Any]) -> ToolOutput:
        from peak_tune.workbench.view import checkpoint_json, show_text

        c = self.bench.store.get(arguments["name"])
        context = self.bench.stored_context(c)
        current = self.bench.store.current()
        data = {**checkpoint_json(c, current), "sequence": list(context.applied),
                "source": context.source}
        return ToolOutput(show_text(c, self.bench.chain(c), context, current), data)

    def _diff(self, arguments: dict[str, Any]) -> ToolOutput:
        text = self.bench.diff(arguments["a"], arguments["b"])
        return ToolOutput(text or "the sources are the same", {"diff": text})

    def _compare(self, arguments: dict[str, Any]) -> ToolOutput:
        from peak_tune.workbench.view import checkpoint_json, compare_text

        checkpoints = [self.bench.store.get(n) for n in arguments["names"]]
        return ToolOutput(compare_text([(c, c.key) for c in checkpoints]),
                          {"checkpoints": [checkpoint_json(c) for c in checkpoints]})

    def _evaluate(self, arguments: dict[str, Any]) -> ToolOutput:
        from peak_tune.workbench.view import evaluation_text

        _, evaluation = self.bench.evaluate(arguments["name"], _target(arguments))
        timing = evaluation.timing()
        text = evaluation_text(evaluation)
        if timing.status != "ok":
            raise UserError(text)
        return ToolOutput(text, {**vars(timing), "ratio": timing.ratio, "key": evaluation.key,
                                 "compiles": evaluation.compiles})

    def _restore(self, arguments: dict[str, Any]) -> ToolOutput:
        self.bench.restore(arguments["name"])
        return ToolOutput(f"current checkpoint: {arguments['name']}",
                          {"current": arguments["name"]})


def _error(ident: Any, code: int, message: str) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": ident, "error": {"code": code, "message": message}}


def serve_stdio(config: WorkbenchConfig, stdin: IO[str] | None = None) -> int:
    """Serve until stdin closes. Returns the exit status."""
    protocol = os.fdopen(os.dup(sys.stdout.fileno()), "w", encoding="utf-8")
    sys.stdout.flush()
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # stray output goes to stderr
    sys.stdout = sys.stderr
    bench = Workbench(config)
    server = McpServer(bench)
    log.info("peak-tune MCP server ready (results %s)", config.results)
    try:
        for line in stdin or sys.stdin:
            reply = server.handle_line(line)
            if reply is not None:
                protocol.write(json.dumps(reply) + "\n")
                protocol.flush()
    finally:
        bench.close()
        protocol.close()
    return 0
