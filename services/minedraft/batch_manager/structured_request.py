"""Structured-output request fields (OpenAI's response_format, vLLM's structured_outputs and the older
guided_* names) into one StructuredOutput, and the grammar a chat request's output must match.

A request may constrain its output through one of these fields only; a second one is a 400 naming it, so no
client silently gets a constraint it did not mean. A chat request's grammar also holds the reasoning of a
thinking model (free text up to `</think>`, then the answer) and forced tool calls in the model's own format,
composed as llguidance sub-grammars so each part keeps its own compiled form.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool

from minedraft.batch_manager.reasoning import Start, reasoning_lark
from minedraft.batch_manager.tool_calls import ToolPlan
from minedraft.core.errors import InvalidRequestError
from minedraft.core.structured import StructuredOutput, compiled_grammar


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, populate_by_name=True)


class JsonSchemaFormat(_Strict):
    name: str | None = None  # OpenAI requires it; it names the schema and changes nothing here
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: StrictBool | None = None  # the output always follows the schema here


class ResponseFormat(_Strict):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class StructuredOutputsParams(_Strict):
    """vLLM's `structured_outputs`: exactly one of json, regex, choice, grammar, json_object."""

    json_: dict[str, Any] | str | None = Field(default=None, alias="json")
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: StrictBool | None = None
    disable_fallback: StrictBool | None = None  # there is one backend: nothing to fall back from
    disable_any_whitespace: StrictBool | None = None  # JSON is always compact here
    disable_additional_properties: StrictBool | None = None
    whitespace_pattern: str | None = None
    structural_tag: str | None = None


def _schema_text(schema: dict[str, Any] | str, param: str) -> str:
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except ValueError as exc:
            raise InvalidRequestError(f"{param} is not valid JSON: {exc}", param=param) from None
    if not isinstance(schema, dict):
        raise InvalidRequestError(f"{param} must be a JSON schema (an object)", param=param)
    return json.dumps(schema)


class StructuredFields(_Strict):
    """The fields, shared by /v1/completions and /v1/chat/completions."""

    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputsParams | None = None
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    guided_decoding_backend: str | None = None  # accepted: llguidance serves every kind
    guided_whitespace_pattern: str | None = None

    def structured_output(self) -> StructuredOutput | None:
        """What the output must match, or None; InvalidRequestError names a field that cannot be served."""
        found = [(name, so) for name, so in self._sources() if so is not None]
        if len(found) > 1:
            raise InvalidRequestError(f"{found[1][0]}: only one structured-output field per request (also got "
                                      f"{found[0][0]})", param=found[1][0])
        return found[0][1] if found else None

    def _sources(self) -> list[tuple[str, StructuredOutput | None]]:
        if self.guided_whitespace_pattern is not None:
            raise InvalidRequestError("guided_whitespace_pattern: not supported (JSON is compact)",
                                      param="guided_whitespace_pattern")
        guided = [("guided_json", None if self.guided_json is None else
                   StructuredOutput("json_schema", _schema_text(self.guided_json, "guided_json"), "guided_json")),
                  ("guided_regex", _maybe("regex", self.guided_regex, "guided_regex")),
                  ("guided_choice", _maybe("choice", self.guided_choice, "guided_choice")),
                  ("guided_grammar", _maybe("grammar", self.guided_grammar, "guided_grammar"))]
        return [("response_format", self._response_format()), ("structured_outputs", self._vllm()), *guided]

    def _response_format(self) -> StructuredOutput | None:
        rf = self.response_format
        if rf is None or rf.type == "text":
            return None
        if rf.type == "json_object":
            return StructuredOutput("json_object", "", "response_format")
        if rf.json_schema is None or rf.json_schema.schema_ is None:
            raise InvalidRequestError("response_format: type json_schema needs json_schema.schema",
                                      param="response_format")
        return StructuredOutput("json_schema", _schema_text(rf.json_schema.schema_, "response_format"),
                                "response_format")

    def _vllm(self) -> StructuredOutput | None:
        so, param = self.structured_outputs, "structured_outputs"
        if so is None:
            return None
        for name in ("whitespace_pattern", "structural_tag", "disable_additional_properties"):
            if getattr(so, name):
                raise InvalidRequestError(f"{param}.{name}: not supported", param=param)
        given = [(kind, value) for kind, value in (("json_schema", so.json_), ("regex", so.regex),
                                                   ("choice", so.choice), ("grammar", so.grammar),
                                                   ("json_object", so.json_object or None)) if value is not None]
        if len(given) != 1:
            raise InvalidRequestError(f"{param} must set exactly one of json, regex, choice, grammar, json_object",
                                      param=param)
        kind, value = given[0]
        if kind == "json_schema":
            return StructuredOutput(kind, _schema_text(value, param), param)
        return _maybe(kind, "" if kind == "json_object" else value, param)


def _maybe(kind: str, value: str | list[str] | None, param: str) -> StructuredOutput | None:
    if value is None:
        return None
    return StructuredOutput(kind, json.dumps(value) if isinstance(value, list) else value, param)


def _sub_grammar(name: str, structured: StructuredOutput) -> dict[str, Any]:
    """`structured` as one named llguidance grammar (a JSON schema or Lark text)."""
    if structured.kind == "llguidance":
        raise InvalidRequestError("an llguidance grammar cannot be combined with reasoning or tools",
                                  param=structured.param)
    text = compiled_grammar(structured.kind, structured.spec, structured.param)
    if text.lstrip().startswith("{"):
        (grammar,) = json.loads(text)["grammars"]
        return {**grammar, "name": name}
    return {"name": name, "lark_grammar": text}


def chat_grammar(answer: StructuredOutput | None, start: Start | None, tools: ToolPlan | None
                 ) -> StructuredOutput | None:
    """The grammar of a chat request's whole output: the reasoning part (when the model thinks first), then the
    answer (`answer`, forced tool calls, or with `auto` and an answer format either of them); None when the
    output is free."""
    forced = tools is not None and tools.forced
    reasons = start in ("inside", "maybe")
    if answer is None and not forced:
        return None
    if not reasons and not forced and tools is None:
        return answer  # the common case: the answer's own grammar, as the request gave it
    rules: list[str] = []
    subs: list[dict[str, Any]] = []
    if answer is not None:
        subs.append(_sub_grammar("answer", answer))
    choices = [] if forced or answer is None else ["@answer"]
    if tools is not None:
        calls, tool_subs = tools.calls_lark()
        rules.append(calls)
        subs.extend(tool_subs)
        choices.append("tool_calls")
    body = choices[0] if len(choices) == 1 else "(" + " | ".join(choices) + ")"
    main = reasoning_lark(start if reasons else "off", body)  # type: ignore[arg-type]
    grammars = [{"name": "main", "lark_grammar": "\n".join([main, *rules])}, *subs]
    param = answer.param if answer is not None else "tools"
    return StructuredOutput("llguidance", json.dumps({"grammars": grammars}), param)
