"""Function calling, the output side: a model's text into content and tool-call deltas, as it streams.

A call's header (index, id, name) goes out once its name is read, then its arguments as they grow: the
arguments value's own text, never the object or markers around it, so the fragments of a stream join into
exactly the arguments of the whole response. Text outside the calls is content; what may be the start of a
call marker is held back until the next text says whether it is one.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field

from minedraft.batch_manager.reasoning import held_back
from minedraft.batch_manager.tool_calls import ToolFormat

ARGUMENT_KEYS = ("arguments", "parameters")  # Qwen writes the first, Llama 3 the second


@dataclass(slots=True)
class ToolCallDelta:
    """A piece of call `index`: the first has its id and name, the others pieces of its arguments' text."""

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""


@dataclass(slots=True)
class CallScanner:
    """One call's JSON object, character by character: its name when read, its arguments' text so far."""

    text: str = ""
    depth: int = 0
    in_string: bool = False
    escaped: bool = False
    key: str | None = None  # the last top-level key read
    key_start: int = -1
    value_start: int = -1  # of the top-level value being read
    name: str | None = None
    args_start: int = -1
    args_end: int = -1
    done: bool = False
    broken: bool = False

    def feed(self, char: str) -> None:
        """One character; `done` once the object closes, `broken` when the text is no JSON object."""
        at = len(self.text)
        self.text += char
        if self.in_string:
            if self.escaped:
                self.escaped = False
            elif char == "\\":
                self.escaped = True
            elif char == '"':
                self.in_string = False
                if self.depth == 1 and self.value_start < 0:
                    self.key = _loads(self.text[self.key_start:])  # type: ignore[assignment]
            return
        if char.isspace():
            return
        if (self.depth == 0 and char != "{") or char == "<":  # no object, or a marker inside an open one
            self.broken = True
            return
        if char == '"':
            self.in_string = True
            if self.depth == 1 and self.value_start < 0:
                self.key_start = at
        elif self.depth == 1 and char == ":":
            self.value_start = at + 1
            if self.key in ARGUMENT_KEYS and self.args_start < 0:
                self.args_start = self.value_start
        elif self.depth == 1 and char in ",}":
            self._value_end(at)
        if char in "{[":
            self.depth += 1
        elif char in "}]":
            self.depth -= 1
            self.done = self.depth == 0
            if self.depth == 1 and self.value_start >= 0 and self.key in ARGUMENT_KEYS and self.args_end < 0:
                self.args_end = at + 1  # an object or array of arguments ends with its own bracket

    def _value_end(self, at: int) -> None:
        value = self.text[self.value_start:at].strip()
        if self.key == "name":
            name = _loads(value)
            self.name = name if isinstance(name, str) else None
        elif self.key in ARGUMENT_KEYS and self.args_end < 0:
            self.args_end = at
        self.value_start = -1

    def arguments(self) -> str:
        """The arguments' text so far: an object or array as it grows, anything else once complete (a string
        holding JSON, as some models write it, decoded)."""
        if self.args_start < 0:
            return ""
        raw = self.text[self.args_start:self.args_end if self.args_end >= 0 else len(self.text)].strip()
        if raw.startswith(("{", "[")):
            return raw if self.args_end >= 0 else self.text[self.args_start:].lstrip()
        if self.args_end < 0:
            return ""
        value = _loads(raw)
        return value if isinstance(value, str) else raw

    @property
    def valid(self) -> bool:
        return self.done and not self.broken and self.name is not None and _loads(self.text) is not None


def _loads(text: str) -> object:
    try:
        return json.loads(text)
    except ValueError:
        return None


@dataclass(slots=True)
class _Call:
    scanner: CallScanner = field(default_factory=CallScanner)
    sent_header: bool = False
    sent_args: int = 0


@dataclass(slots=True)
class ToolCallParser:
    """Content and calls out of streamed text, in `format`; with `single`, calls after the first are dropped."""

    format: ToolFormat
    single: bool = False
    calls: list[_Call] = field(default_factory=list)
    raw: str = ""  # every character fed: the content, should the calls turn out malformed
    buffer: str = ""
    in_call: bool = False
    content_seen: bool = False  # the output started with text, not a call (Llama 3's calls come first)

    def feed(self, text: str) -> tuple[str, list[ToolCallDelta]]:
        self.raw += text
        self.buffer += text
        content: list[str] = []
        deltas: list[ToolCallDelta] = []
        opener = self.format.open.strip() or "{"
        while self.buffer:
            if self.in_call:
                if not self._scan(deltas):
                    break
                continue
            at = self.buffer.find(opener)
            if not self.format.open and (self.content_seen or (at and self.buffer[:at].strip(" \n;"))):
                at = -1  # Llama 3: a call only where the output starts (or the last call ended)
            if at < 0:
                keep = held_back(self.buffer, opener) if self.format.open else 0
                content.append(self._content(self.buffer[:len(self.buffer) - keep]))
                self.buffer = self.buffer[len(self.buffer) - keep:]
                break
            content.append(self._content(self.buffer[:at]))
            self.buffer = self.buffer[at + (len(opener) if self.format.open else 0):]
            self.in_call = True
            self.calls.append(_Call())
        return "".join(content), deltas

    def finish(self) -> tuple[str, list[ToolCallDelta]]:
        """The held-back text (a marker that never completed is content) and the last arguments."""
        rest, self.buffer = ("" if self.in_call else self.buffer), ""
        deltas: list[ToolCallDelta] = []
        if self.calls:
            self._emit(len(self.calls) - 1, deltas)
        return self._content(rest), deltas

    def whole_calls(self) -> list[int] | None:
        """The indices of the calls a whole reply returns: every call read, but a last one the length limit cut
        off; None when one is malformed or none is left (the text is then the content, as the model wrote it)."""
        calls = self.calls[:1] if self.single else self.calls
        if calls and self.in_call and not (calls[-1].scanner.done or calls[-1].scanner.broken):
            calls = calls[:-1]
        if not calls or not all(c.scanner.valid for c in calls):
            return None
        return list(range(len(calls)))

    def _content(self, text: str) -> str:
        if self.calls and not text.strip(" \t\r\n" + self.format.separator):
            return ""  # the gaps between calls
        self.content_seen = self.content_seen or bool(text.strip())
        return "" if self.calls and self.single else text

    def _scan(self, deltas: list[ToolCallDelta]) -> bool:
        """Feed the open call until its object ends, then skip past its close marker; whether it ended."""
        index = len(self.calls) - 1
        scanner = self.calls[index].scanner
        used = 0
        for char in self.buffer:
            if scanner.done or scanner.broken:
                break
            scanner.feed(char)
            used += 1
        self.buffer = self.buffer[used:]
        self._emit(index, deltas)
        if not (scanner.done or scanner.broken):
            return False
        close = self.format.close.strip()
        if close:
            at = self.buffer.find(close)
            if at < 0:
                self.buffer = self.buffer[len(self.buffer) - held_back(self.buffer, close):]
                return False
            self.buffer = self.buffer[at + len(close):]
        self.in_call = False
        return True

    def _emit(self, index: int, deltas: list[ToolCallDelta]) -> None:
        if self.single and index > 0:
            return
        call = self.calls[index]
        name = call.scanner.name
        if name is None:
            return
        if not call.sent_header:
            call.sent_header = True
            deltas.append(ToolCallDelta(index, f"call_{uuid.uuid4().hex[:24]}", name))
        arguments = call.scanner.arguments()
        if len(arguments) > call.sent_args:
            deltas.append(ToolCallDelta(index, arguments=arguments[call.sent_args:]))
            call.sent_args = len(arguments)
