"""A chat request's prompt and what its reply must be, for both APIs: the rendered conversation (with the
tools, when a call may come), how the reply is read (reasoning, tool calls) and the grammar it must match.

Whether the model thinks first is read off the rendered prompt (an open `<think>` at its end, a closed one
for `enable_thinking: false`), so it follows the template and its kwargs without knowing either. With
tool_choice "none" the tools are not rendered: the model is not told about calls it may not make.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from minedraft.batch_manager.assistant_output import AssistantPlan
from minedraft.batch_manager.chat import RenderOptions, chat_template
from minedraft.batch_manager.openai_models import ChatMessage
from minedraft.batch_manager.prompt_ids import chat_ids
from minedraft.batch_manager.reasoning import reasoning_start
from minedraft.batch_manager.structured_request import chat_grammar
from minedraft.batch_manager.tool_calls import ChatTool, template_tools, tool_plan
from minedraft.core.structured import StructuredOutput
from minedraft.core.tokenizer import Tokenizer

TAIL_TOKENS = 16  # the prompt's last tokens, decoded, show whether a think block is open or closed


@dataclass(frozen=True, slots=True)
class ChatPlan:
    ids: list[int]
    assistant: AssistantPlan | None  # None: the reply is plain content
    structured: StructuredOutput | None  # the grammar of the whole reply; None: free


@dataclass(frozen=True, slots=True)
class ChatTools:
    """The request's tool fields (OpenAI's names)."""

    tools: list[ChatTool] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None


async def plan_chat(tokenizer: Tokenizer, messages: list[ChatMessage], options: RenderOptions, max_context: int,
                    tools: ChatTools, answer: StructuredOutput | None) -> ChatPlan:
    """Render the conversation and plan its reply; InvalidRequestError names a field that cannot be served."""
    template = options.template or chat_template(tokenizer)
    plan = tool_plan(tools.tools, tools.tool_choice, tools.parallel_tool_calls, template)
    if plan is not None:
        options = dataclasses.replace(options, tools=template_tools(tools.tools))
    ids = await chat_ids(tokenizer, messages, max_context, options)
    start = reasoning_start(template, tokenizer.decode(ids[-TAIL_TOKENS:], skip_special_tokens=False))
    thinks = start if start in ("inside", "maybe") else None
    assistant = AssistantPlan(thinks, plan) if thinks or plan else None
    return ChatPlan(ids, assistant, chat_grammar(answer, thinks, plan))
