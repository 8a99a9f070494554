"""`minedraft generate`: the offline CLI drafts with the bundled EAGLE head and prints AR's greedy tokens."""

from __future__ import annotations

import json

import pytest

from minedraft.bundled import TINY_DRAFT, TINY_EAGLE
from minedraft.cli.main import build_parser, main
from minedraft.cli.options import draft_folder
from minedraft.engine.llm_engine import LLMEngine

PROMPTS = ["def main(argv):\n    ", "import os\nimport sys\n\n\nclass "]


def _token_ids(capsys: pytest.CaptureFixture[str], *flags: str) -> list[list[int]]:
    argv = ["generate", "--max-tokens", "24", "--ignore-eos", "--json", *flags]
    for prompt in PROMPTS:
        argv += ["--prompt", prompt]
    assert main(argv) == 0
    return [json.loads(line)["token_ids"] for line in capsys.readouterr().out.splitlines()]


@pytest.mark.skipif(not (TINY_EAGLE / "config.json").exists(), reason="bundled head not built")
def test_generate_with_the_bundled_eagle_head_equals_ar(capsys: pytest.CaptureFixture[str],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    loaded: list[tuple[str, str]] = []
    real = LLMEngine.from_folders.__func__  # type: ignore[attr-defined]

    def recording(cls, target, draft, config):
        loaded.append((str(draft), config.draft_kind))
        return real(cls, target, draft, config)

    monkeypatch.setattr(LLMEngine, "from_folders", classmethod(recording))
    ar = _token_ids(capsys, "--mode", "ar")
    eagle = _token_ids(capsys, "--mode", "sd", "--k", "4", "--draft-kind", "eagle")
    assert loaded[-1] == (str(TINY_EAGLE), "eagle")  # no --draft: the bundled head
    assert len(ar) == len(PROMPTS) and all(len(ids) == 24 for ids in ar)
    assert eagle == ar


def test_generate_defaults_to_the_bundled_draft_model() -> None:
    args = build_parser().parse_args(["generate"])
    assert (args.draft_kind, draft_folder(args)) == ("model", str(TINY_DRAFT))
    args = build_parser().parse_args(["generate", "--draft-kind", "eagle", "--draft", "/heads/mine"])
    assert draft_folder(args) == "/heads/mine"
