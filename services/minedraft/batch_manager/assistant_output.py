"""One choice's text as an assistant message: reasoning, content and tool calls, for both APIs.

The text goes through the reasoning split first (a thinking model writes its calls after `</think>`), then
the tool-call parser. The same state serves a stream (a delta per chunk) and a whole reply (the deltas
joined), so both say the same; only a whole reply can still take back calls that turned out malformed (the
text is then the content, as the model wrote it).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from minedraft.batch_manager.reasoning import ReasoningSplitter, Start
from minedraft.batch_manager.tool_calls import ToolPlan
from minedraft.batch_manager.tool_parser import ToolCallDelta, ToolCallParser

FINISH_TOOL_CALLS = "tool_calls"


@dataclass(frozen=True, slots=True)
class AssistantPlan:
    """How a request's output is read: where its reasoning starts (None: no reasoning) and its tools."""

    reasoning: Start | None = None
    tools: ToolPlan | None = None


@dataclass(slots=True)
class AssistantDelta:
    reasoning: str = ""
    content: str = ""
    tool_calls: list[ToolCallDelta] = field(default_factory=list)


@dataclass(slots=True)
class Call:
    """A whole tool call, joined from its deltas."""

    id: str
    name: str
    arguments: str = ""


@dataclass(slots=True)
class AssistantMessage:
    content: str | None
    reasoning: str | None
    tool_calls: list[Call]


class AssistantState:
    """One choice being read, text piece by text piece."""

    def __init__(self, plan: AssistantPlan) -> None:
        self.plan = plan
        self.splitter = ReasoningSplitter.of(plan.reasoning) if plan.reasoning is not None else None
        tools = plan.tools
        self.parser = ToolCallParser(tools.format, not tools.parallel) if tools is not None else None
        self._reasoning: list[str] = []
        self._content: list[str] = []
        self._calls: dict[int, Call] = {}

    def feed(self, text: str, final: bool = False) -> AssistantDelta:
        """The delta for `text`; with `final`, also everything held back (the choice has ended)."""
        reasoning, content = self.splitter.feed(text) if self.splitter else ("", text)
        if final and self.splitter:
            more = self.splitter.finish()
            reasoning, content = reasoning + more[0], content + more[1]
        deltas: list[ToolCallDelta] = []
        if self.parser is not None:
            content, deltas = self.parser.feed(content)
            if final:
                rest, last = self.parser.finish()
                content, deltas = content + rest, deltas + last
        self._reasoning.append(reasoning)
        self._content.append(content)
        for d in deltas:
            if d.id is not None and d.name is not None:
                self._calls[d.index] = Call(d.id, d.name)
            else:
                self._calls[d.index].arguments += d.arguments
        return AssistantDelta(reasoning, content, deltas)

    @property
    def called(self) -> bool:
        return bool(self._calls)

    def finish_reason(self, reason: str | None, whole: bool = False) -> str | None:
        """"tool_calls" for a reply that ended by calling (a named function keeps "stop", as OpenAI's)."""
        calls = self.whole_calls() if whole else self.called
        named = self.plan.tools is not None and self.plan.tools.mode == "named"
        return FINISH_TOOL_CALLS if reason == "stop" and calls and not named else reason

    def whole_calls(self) -> list[int] | None:
        return self.parser.whole_calls() if self.called and self.parser is not None else None

    def message(self) -> AssistantMessage:
        """The whole reply; malformed calls are given back as content."""
        reasoning = "".join(self._reasoning) or None
        whole = self.whole_calls()
        if self.called and whole is None:
            assert self.parser is not None
            return AssistantMessage(self.parser.raw, reasoning, [])
        content = "".join(self._content)
        calls = [self._calls[i] for i in whole or () if i in self._calls]
        return AssistantMessage(None if calls and not content.strip() else content, reasoning, calls)
