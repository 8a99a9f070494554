"""Structured outputs: what a request constrains its output to, as one llguidance grammar.

The API layers turn OpenAI's `response_format` (json_schema, json_object), vLLM's `structured_outputs`
(`choice`, `regex`, `json`, `grammar`) and tool calls into a StructuredOutput; the batch manager checks it
(a bad schema, regex or grammar is the client's error, named) and sends its grammar text to both workers,
which mask the target's and the draft's distributions with it at every position (engine/grammar.py).
llguidance (no dependencies, so the batch manager carries it without torch) compiles JSON schemas, regexes
and Lark or GBNF grammars into one format, matches incrementally and rolls back, which speculation needs.
JSON comes out compact (no whitespace between tokens): a model cannot pad it with newlines forever.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import lru_cache

from minedraft.core.errors import InvalidRequestError

KINDS = ("json_schema", "json_object", "regex", "choice", "grammar", "llguidance")
COMPACT_JSON = {"whitespace_flexible": False, "item_separator": ",", "key_separator": ":"}


@dataclass(frozen=True, slots=True)
class StructuredOutput:
    """kind: one of KINDS; spec: the schema (JSON text), the regex, the choices (a JSON list of strings), the
    Lark/GBNF grammar, or an llguidance grammar as is; `param`: the request field to name in errors."""

    kind: str
    spec: str = ""
    param: str = field(default="response_format", compare=False)

    def grammar(self) -> str:
        """The llguidance grammar text (raises InvalidRequestError naming `param`)."""
        return compiled_grammar(self.kind, self.spec, self.param)

    def check(self) -> None:
        """Raise InvalidRequestError, naming the field, unless the grammar compiles."""
        from llguidance import LLMatcher

        error = LLMatcher.validate_grammar(self.grammar())
        if error and not error.startswith("WARNING"):
            raise InvalidRequestError(f"{self.param} does not compile: {error.strip()[:300]}", param=self.param)


@lru_cache(maxsize=256)
def compiled_grammar(kind: str, spec: str, param: str) -> str:
    from llguidance import LLMatcher
    from llguidance.gbnf_to_lark import any_to_lark

    if kind not in KINDS:
        raise InvalidRequestError(f"unknown structured output kind {kind!r}", param=param)
    try:
        if kind == "json_object":
            return LLMatcher.grammar_from_json_schema({"type": "object"}, defaults=COMPACT_JSON)
        if kind == "json_schema":
            return LLMatcher.grammar_from_json_schema(json.loads(spec), defaults=COMPACT_JSON)
        if kind == "regex":
            return LLMatcher.grammar_from_regex(spec)
        if kind == "choice":
            choices = json.loads(spec)
            if not isinstance(choices, list) or not choices or not all(isinstance(c, str) for c in choices):
                raise InvalidRequestError("choice must be a non-empty list of strings", param=param)
            return LLMatcher.grammar_from_lark("start: " + " | ".join(json.dumps(c) for c in choices))
        if kind == "grammar":
            return LLMatcher.grammar_from_lark(any_to_lark(spec))
        return spec
    except InvalidRequestError:
        raise
    except (ValueError, TypeError) as exc:
        raise InvalidRequestError(f"{param} is not valid: {exc}", param=param) from None


class GrammarChecker:
    """Compiles each distinct grammar once against the model's tokenizer, as the workers will (a grammar valid
    on its own can still fail there: the batch manager refuses it rather than a worker failing a step)."""

    def __init__(self, tokenizer_json: str, vocab_size: int, eos_ids: list[int]) -> None:
        self.tokenizer_json, self.vocab_size, self.eos_ids = tokenizer_json, vocab_size, eos_ids
        self._tokenizer = None  # llguidance.LLTokenizer, built on the first grammar
        self._good: dict[str, None] = {}  # grammars that compiled, most recent last (bounded)

    def check(self, structured: StructuredOutput) -> None:
        from llguidance import LLMatcher, LLTokenizer

        grammar = structured.grammar()
        if grammar in self._good:
            return
        if self._tokenizer is None:
            self._tokenizer = LLTokenizer(self.tokenizer_json, n_vocab=self.vocab_size, eos_token=self.eos_ids or None)
        matcher = LLMatcher(self._tokenizer, grammar, log_level=0)
        if matcher.is_error():
            raise InvalidRequestError(f"{structured.param} does not compile for this model's tokenizer: "
                                      f"{matcher.get_error().strip()[:300]}", param=structured.param)
        self._good[grammar] = None
        if len(self._good) > 256:
            del self._good[next(iter(self._good))]
