"""Streamed text is built token by token and must equal a full decode of the output."""

from __future__ import annotations

import random

import pytest

from minedraft.bundled import TINY_TARGET
from minedraft.core.request import FINISH_LENGTH, FINISH_STOP, Request
from minedraft.core.sampling_params import SamplingParams
from minedraft.core.tokenizer import Tokenizer

TEXTS = [
    "héllo wörld: naïve café, señor",
    "日本語のテキスト 😀🎉 emoji and ✓ marks",
    "def f(x):\n    return x ** 2  # ünïcödé\n",
]


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return Tokenizer(TINY_TARGET)


class CountingTokenizer(Tokenizer):
    """The real tokenizer, counting full decodes (the O(n) operation streaming must avoid)."""

    def __init__(self, folder: object) -> None:
        super().__init__(folder)  # type: ignore[arg-type]
        self.full_decodes = 0

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        self.full_decodes += 1
        return super().decode(ids, skip_special_tokens)


def stream(tokenizer: Tokenizer, ids: list[int], chunk: int, **params: object) -> tuple[Request, str]:
    """Feed `ids` `chunk` at a time, as verdicts arrive, and join what a client would receive."""
    req = Request(1, [1], SamplingParams(max_tokens=len(ids), ignore_eos=True, **params))  # type: ignore[arg-type]
    received = []
    for start in range(0, len(ids), chunk):
        req.append_tokens(ids[start:start + chunk], frozenset(), tokenizer)
        received.append(req.take_delta()[0])
        if req.finished:
            break
    return req, "".join(received)


@pytest.mark.parametrize("text", TEXTS)
@pytest.mark.parametrize("chunk", [1, 3, 5])
def test_streamed_text_equals_full_decode(tokenizer: Tokenizer, text: str, chunk: int) -> None:
    ids = tokenizer.encode(text, add_special_tokens=False)
    req, received = stream(tokenizer, ids, chunk)
    assert req.finish_reason == FINISH_LENGTH
    assert received == req.text == tokenizer.decode(ids)
    assert "\ufffd" not in received  # multi-byte characters arrive whole


def test_random_ids_match_full_decode_including_a_split_character_at_the_end(tokenizer: Tokenizer) -> None:
    """Arbitrary token soup (byte-fallback pieces that never complete a character) still matches."""
    rng = random.Random(0)
    for _ in range(50):
        ids = [rng.randrange(tokenizer.vocab_size) for _ in range(rng.randrange(1, 40))]
        req, received = stream(tokenizer, ids, rng.choice([1, 2, 4]))
        assert received == req.text == tokenizer.decode(ids)


def test_a_character_split_across_steps_is_held_back_until_complete(tokenizer: Tokenizer) -> None:
    ids = tokenizer.encode("😀", add_special_tokens=False)
    assert len(ids) > 1, "the bundled tokenizer spells this emoji with byte-fallback pieces"
    req = Request(1, [1], SamplingParams(max_tokens=10, ignore_eos=True))
    req.append_tokens(ids[:1], frozenset(), tokenizer)
    assert req.take_delta()[0] == ""
    req.append_tokens(ids[1:], frozenset(), tokenizer)
    assert req.take_delta()[0] == "😀"


def test_streaming_does_not_redecode_the_output(tokenizer: Tokenizer) -> None:
    counting = CountingTokenizer(TINY_TARGET)
    ids = tokenizer.encode(" ".join(TEXTS) * 4, add_special_tokens=False)
    _, received = stream(counting, ids, 1)
    assert received == tokenizer.decode(ids)
    assert counting.full_decodes <= 1  # at most the end-of-request flush, never once per step


def test_stop_string_split_across_tokens_cuts_the_text(tokenizer: Tokenizer) -> None:
    text = "alpha beta gamma delta"
    ids = tokenizer.encode(text, add_special_tokens=False)
    req, received = stream(tokenizer, ids, 1, stop=["gam"])
    assert req.finish_reason == FINISH_STOP
    assert received == req.text == "alpha beta "


def test_an_abort_releases_everything_held_back(tokenizer: Tokenizer) -> None:
    """A request aborted mid-character (a deadline, a drain) ends with what a full decode shows, and
    text held back for a possible stop string arrives too."""
    ids = tokenizer.encode("ok 😀", add_special_tokens=False)
    req = Request(1, [1], SamplingParams(max_tokens=50, ignore_eos=True, stop=["never said"]))
    req.append_tokens(ids[:-1], frozenset(), tokenizer)  # the emoji's last byte piece still to come
    sent = req.take_delta()[0]
    req.abort()
    assert req.finish_reason == "abort"
    assert sent + req.take_delta()[0] == req.text == tokenizer.decode(ids[:-1])
    req.abort()  # a second abort changes nothing
    assert req.take_delta()[0] == ""
