"""Thinking models' `<think>` blocks: where the reasoning ends, as a split of the output and as a grammar.

Qwen3-style templates either leave the choice to the model (it opens `<think>` itself), open the block in
the prompt (the output is reasoning up to `</think>`), or close an empty block there
(`enable_thinking: false`), so the rendered prompt's tail says which of the three a request is in. The split
runs over streamed text, holding back only what may be the start of a marker; a structured answer is
grammar-constrained only after `</think>`, since the reasoning itself is free text.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"

Start = Literal["inside", "maybe", "off"]  # reasoning open in the prompt / the model may open it / no reasoning


def reasoning_start(template: str | None, prompt_tail: str) -> Start | None:
    """How a request's output starts; None when the template knows no `<think>` blocks (nothing is split)."""
    if not template or THINK_CLOSE not in template:
        return None
    tail = prompt_tail.rstrip()
    if tail.endswith(THINK_OPEN):
        return "inside"
    return "off" if tail.endswith(THINK_CLOSE) else "maybe"


def reasoning_lark(start: Start, answer: str) -> str:
    """Lark rules for `start`: the free reasoning (in "maybe", only if the model opens it), then `answer`."""
    rules = ['think_text[lazy]: /(?s:.*)<\\/think>/', 'think_gap: /\\n{0,2}/']
    if start == "inside":
        head = "start: think_text think_gap " + answer
    elif start == "maybe":
        head = f'start: ("{THINK_OPEN}" think_text think_gap)? {answer}'
    else:
        head = f"start: {answer}"
    return "\n".join([head, *rules])


def held_back(text: str, marker: str) -> int:
    """Characters at the end of `text` that could be the start of `marker` (kept until more text comes)."""
    for size in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-size:]):
            return size
    return 0


@dataclass(slots=True)
class ReasoningSplitter:
    """Streamed text into (reasoning, content) pieces; leading whitespace of each part is dropped."""

    state: str  # "maybe" (deciding), "inside", "content"
    buffer: str = ""
    started: bool = False  # the current part has shown a non-space character

    @classmethod
    def of(cls, start: Start) -> ReasoningSplitter:
        return cls("content" if start == "off" else start)

    def feed(self, text: str) -> tuple[str, str]:
        self.buffer += text
        reasoning, content = "", ""
        if self.state == "maybe":
            head = self.buffer.lstrip()
            if THINK_OPEN.startswith(head):
                return "", ""  # could still become "<think>"
            if head.startswith(THINK_OPEN):
                self.buffer = head[len(THINK_OPEN):]
                self.state = "inside"
            else:
                self.state = "content"
        if self.state == "inside":
            at = self.buffer.find(THINK_CLOSE)
            if at < 0:
                keep = held_back(self.buffer, THINK_CLOSE)
                reasoning = self.buffer[:len(self.buffer) - keep]
                self.buffer = self.buffer[len(reasoning):]
                return self._shown(reasoning), ""
            reasoning = self._shown(self.buffer[:at])
            self.buffer = self.buffer[at + len(THINK_CLOSE):]
            self.state, self.started = "content", False
        content, self.buffer = self.buffer, ""
        return reasoning, self._shown(content)

    def finish(self) -> tuple[str, str]:
        """What was held back: an unfinished marker is text of the part it was in."""
        rest, self.buffer = self.buffer, ""
        if self.state == "inside":
            return self._shown(rest), ""
        return "", self._shown(rest)

    def _shown(self, text: str) -> str:
        if not self.started:
            text = text.lstrip()
            self.started = bool(text)
        return text
