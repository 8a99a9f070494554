"""Function calling, the request side: the tools, what tool_choice asks for, the model family's call format.

`auto` leaves the model free and parses what it writes (tool_parser.py); `required` and a named function
constrain the output to the family's own call format with each function's `parameters` schema inside, so
the arguments are valid by construction and the model writes what it was trained to write. The format is
the one the chat template renders for the model: Qwen2.5 / Qwen3 (`<tool_call>` JSON blocks, also what a
template without tools support gets) or Llama 3.x (bare JSON objects with "parameters").
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool

from minedraft.core.errors import InvalidRequestError
from minedraft.core.structured import COMPACT_JSON


class FunctionDef(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[a-zA-Z0-9_.\-]{1,64}$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: StrictBool | None = None  # OpenAI's; the arguments always follow the schema here


class ChatTool(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["function"]
    function: FunctionDef


@dataclass(frozen=True, slots=True)
class ToolFormat:
    """How a model family writes calls: each call `open` + JSON + `close`, calls joined by `separator`."""

    name: str
    open: str
    close: str
    separator: str
    arguments_key: str


HERMES = ToolFormat("hermes", "<tool_call>\n", "\n</tool_call>", "\n", "arguments")  # Qwen2.5, Qwen3
LLAMA3_JSON = ToolFormat("llama3_json", "", "", "; ", "parameters")  # Llama 3.1 / 3.2 / 3.3


def tool_format(template: str | None) -> ToolFormat:
    """The family's format, read from its chat template (Qwen-style blocks when the template says nothing)."""
    if template and "<tool_call>" not in template and ("<|python_tag|>" in template or "ipython" in template):
        return LLAMA3_JSON
    return HERMES


Mode = Literal["auto", "required", "named"]


@dataclass(frozen=True, slots=True)
class ToolPlan:
    """What a request's tools ask of its output."""

    tools: tuple[ChatTool, ...]
    mode: Mode
    format: ToolFormat
    parallel: bool = True  # parallel_tool_calls: false means one call at most (exactly one when forced)
    name: str | None = None  # the named function

    @property
    def forced(self) -> bool:
        return self.mode != "auto"

    def calls_lark(self) -> tuple[str, list[dict[str, Any]]]:
        """Lark rules whose `tool_calls` rule matches the calls this plan allows, and their sub-grammars
        (one JSON schema per function: `{"name": <const>, "<arguments key>": <its parameters>}`)."""
        chosen = [t.function for t in self.tools if self.name is None or t.function.name == self.name]
        subs = [{"name": f"tool_{i}", "json_schema": call_schema(f, self.format.arguments_key)}
                for i, f in enumerate(chosen)]
        body = " | ".join(f"@{sub['name']}" for sub in subs)
        fmt = self.format
        call = " ".join(part for part in (_lit(fmt.open), "tool_body", _lit(fmt.close)) if part)
        many = "" if not self.parallel or self.mode == "named" else f" ({_lit(fmt.separator)} tool_call)*"
        return "\n".join([f"tool_calls: tool_call{many}", f"tool_call: {call}", f"tool_body: {body}"]), subs


def _lit(text: str) -> str:
    return json.dumps(text) if text else ""


def call_schema(function: FunctionDef, arguments_key: str) -> dict[str, Any]:
    """One call's schema (compact JSON); the parameters' $defs move to its root, where their $refs point."""
    params = dict(function.parameters or {"type": "object", "properties": {}})
    hoisted = {key: params.pop(key) for key in ("$defs", "definitions") if key in params}
    return {"type": "object", "properties": {"name": {"const": function.name}, arguments_key: params},
            "required": ["name", arguments_key], "additionalProperties": False, **hoisted,
            "x-guidance": COMPACT_JSON}


def tool_plan(tools: list[ChatTool] | None, tool_choice: str | dict[str, Any] | None, parallel: bool | None,
              template: str | None, param: str = "tool_choice") -> ToolPlan | None:
    """The request's plan; None when no tool can be called (no tools, or tool_choice "none")."""
    if tool_choice is None:
        tool_choice = "auto" if tools else "none"
    if tool_choice == "none":
        return None
    if not tools:
        raise InvalidRequestError(f"{param}: {tool_choice!r} needs `tools`", param=param)
    names = [t.function.name for t in tools]
    if len(set(names)) != len(names):
        raise InvalidRequestError("tools: function names must be unique", param="tools")
    fmt = tool_format(template)
    if tool_choice in ("auto", "required"):
        return ToolPlan(tuple(tools), tool_choice, fmt, parallel is not False)  # type: ignore[arg-type]
    name = _named(tool_choice, param)
    if name not in names:
        raise InvalidRequestError(f"{param}: no function named {name!r} in tools", param=param)
    return ToolPlan(tuple(tools), "named", fmt, False, name)


def _named(choice: str | dict[str, Any], param: str) -> str:
    """{"type": "function", "function": {"name": N}} -> N."""
    function = choice.get("function") if isinstance(choice, dict) else None
    name = function.get("name") if isinstance(function, dict) else None
    if not isinstance(choice, dict) or choice.get("type") != "function" or not isinstance(name, str):
        raise InvalidRequestError(f'{param} must be "none", "auto", "required" or {{"type": "function", '
                                  f'"function": {{"name": ...}}}}, got {choice!r}', param=param)
    return name


def template_tools(tools: list[ChatTool] | None) -> list[dict[str, Any]] | None:
    """The tools as chat templates read them (OpenAI's shape, unset keys left out)."""
    return None if not tools else [t.model_dump(exclude_none=True) for t in tools]


def template_tool_calls(calls: Any) -> Any:
    """An assistant message's tool_calls with JSON-text arguments parsed into objects, since templates write
    them with `tojson` (a string would come out quoted twice); anything else is left as it is."""
    if not isinstance(calls, list):
        return calls
    out = []
    for call in calls:
        function = call.get("function") if isinstance(call, dict) else None
        arguments = function.get("arguments") if isinstance(function, dict) else None
        if isinstance(arguments, str):
            with contextlib.suppress(ValueError):
                call = {**call, "function": {**function, "arguments": json.loads(arguments)}}  # type: ignore[dict-item]
        out.append(call)
    return out
