"""gRPC's structured outputs and chat prompts: the proto fields into what the HTTP API builds from JSON.

Messages and tools travel as OpenAI's JSON objects (one string each), so they are read by the same models as
/v1/chat/completions and a bad one is INVALID_ARGUMENT naming it (`chat.messages[2]`); the reply is read the
same way too (assistant_output.py), so both APIs give the same reasoning, content and tool calls.
"""

from __future__ import annotations

import json
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from minedraft.batch_manager.assistant_output import AssistantDelta, AssistantMessage
from minedraft.batch_manager.chat import RenderOptions
from minedraft.batch_manager.chat_request import ChatPlan, ChatTools, plan_chat
from minedraft.batch_manager.openai_models import ChatMessage
from minedraft.batch_manager.tool_calls import ChatTool
from minedraft.core.errors import InvalidRequestError
from minedraft.core.structured import StructuredOutput
from minedraft.core.tokenizer import Tokenizer
from minedraft.proto import generation_pb2 as pb

M = TypeVar("M", bound=BaseModel)
PARAM = "sampling.structured"


def structured_of(sampling: pb.SamplingParameters) -> StructuredOutput | None:
    """SamplingParameters.structured as the core's StructuredOutput; None when unset."""
    if not sampling.HasField("structured"):
        return None
    so = sampling.structured
    kind = so.WhichOneof("kind")
    if kind is None or (kind == "json_object" and not so.json_object):
        raise InvalidRequestError(f"{PARAM}: set one of json_schema, json_object, regex, choice, grammar",
                                  param=PARAM)
    if kind == "choice":
        return StructuredOutput("choice", json.dumps(list(so.choice.choices)), PARAM)
    return StructuredOutput(kind, "" if kind == "json_object" else getattr(so, kind), PARAM)


def _parsed(model: type[M], text: str, param: str) -> M:
    try:
        return model.model_validate_json(text)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first.get("loc", ()))
        raise InvalidRequestError(f"{param}: {where + ': ' if where else ''}{first.get('msg')}", param=param) from None


def _json(text: str, param: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as exc:
        raise InvalidRequestError(f"{param} is not valid JSON: {exc}", param=param) from None


async def plan_grpc_chat(tokenizer: Tokenizer, chat: pb.Chat, max_context: int, answer: StructuredOutput | None
                         ) -> ChatPlan:
    """The prompt and reply plan of a Chat prompt."""
    if not chat.messages:
        raise InvalidRequestError("chat.messages must not be empty", param="chat.messages")
    messages = [_parsed(ChatMessage, m, f"chat.messages[{i}]") for i, m in enumerate(chat.messages)]
    tools = [_parsed(ChatTool, t, f"chat.tools[{i}]") for i, t in enumerate(chat.tools)] or None
    choice: str | dict[str, Any] | None = chat.tool_choice or None
    if choice is not None and choice.lstrip().startswith("{"):
        choice = _json(choice, "chat.tool_choice")
    kwargs = _json(chat.chat_template_kwargs, "chat.chat_template_kwargs") if chat.chat_template_kwargs else {}
    if not isinstance(kwargs, dict):
        raise InvalidRequestError("chat.chat_template_kwargs must be a JSON object", param="chat.chat_template_kwargs")
    parallel = chat.parallel_tool_calls if chat.HasField("parallel_tool_calls") else None
    return await plan_chat(tokenizer, messages, RenderOptions(template_kwargs=kwargs), max_context,
                           ChatTools(tools, choice, parallel), answer)


def delta_fields(delta: AssistantDelta) -> dict[str, Any]:
    """A chunk's text, reasoning_content and tool_calls fields for one delta."""
    calls = [pb.ToolCall(index=d.index, id=d.id or "", name=d.name or "", arguments=d.arguments)
             for d in delta.tool_calls]
    return {"text": delta.content, "reasoning_content": delta.reasoning, "tool_calls": calls}


def message_fields(message: AssistantMessage) -> dict[str, Any]:
    """A choice's text, reasoning_content and tool_calls fields."""
    calls = [pb.ToolCall(index=i, id=c.id, name=c.name, arguments=c.arguments)
             for i, c in enumerate(message.tool_calls)]
    return {"text": message.content or "", "reasoning_content": message.reasoning or "", "tool_calls": calls}
