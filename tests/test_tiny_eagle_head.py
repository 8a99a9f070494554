"""The tiny head's training form and the engine's head are one function, and the shipped head drafts well."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import torch
from transformers import AutoModelForCausalLM

from minedraft.bench.tiny_pair.eagle import TrainingHead, save_head
from minedraft.bundled import TINY_DRAFT, TINY_EAGLE, TINY_TARGET
from minedraft.cli.local_stack import free_port
from minedraft.core.sampling_params import SamplingParams
from minedraft.engine.eagle_pair import head_beside
from minedraft.engine.loader import load_model
from tests.conftest import engine_from_folders
from tests.test_serve_command import wait_healthy


def test_the_engine_runs_the_head_as_it_was_trained(random_pair: tuple[Path, Path], tmp_path: Path) -> None:
    target_dir, _ = random_pair
    hf = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    torch.manual_seed(0)
    trained = TrainingHead(hf)
    with torch.no_grad():
        for p in trained.parameters():  # what the bfloat16 checkpoint holds
            p.normal_(0, 0.05).copy_(p.bfloat16().float())
    save_head(trained, target_dir, tmp_path / "head")
    drafter = head_beside(load_model(target_dir), tmp_path / "head", 16, 4, "cpu", torch.float32)
    tokens = torch.tensor([[5, 9, 13, 4, 40, 41, 2, 77, 30, 12]])
    features = torch.randn(1, 10, 64)
    with torch.no_grad():
        expected = trained(hf.model.embed_tokens(tokens), features)
    _, got = drafter.head_runner.forward_features([0], tokens, features, [0], [10], [10], last_n=10)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.skipif(not (TINY_EAGLE / "config.json").exists(), reason="bundled head not built")
def test_the_bundled_head_is_exact_and_accepts_more_than_the_draft_model() -> None:
    prompts = ["def main(argv):\n    ", "import os\nimport sys\n\n\nclass ", "    return self._", "x = "]
    params = SamplingParams(max_tokens=40, ignore_eos=True)
    ar = engine_from_folders(TINY_TARGET, None, "ar").generate(prompts, params)
    runs = {kind: engine_from_folders(TINY_TARGET, folder, "sd", k=4, draft_kind=kind).generate(prompts, params)
            for kind, folder in (("eagle", TINY_EAGLE), ("model", TINY_DRAFT))}
    assert [r.output_ids for r in runs["eagle"]] == [r.output_ids for r in ar]
    steps = {kind: sum(r.stats.steps for r in reqs) for kind, reqs in runs.items()}
    assert steps["eagle"] <= steps["model"]  # as many tokens in no more target steps


@pytest.mark.skipif(not (TINY_EAGLE / "config.json").exists(), reason="bundled head not built")
def test_serve_runs_the_bundled_head_out_of_the_box() -> None:
    http_port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "minedraft.cli.main", "serve", "--draft-kind", "eagle", "--http-port", str(http_port),
         "--grpc-port", str(free_port()), "--admin-port", str(free_port()), "--k", "4"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        wait_healthy(http_port, proc)
        body = {"model": "tiny-target", "prompt": "def main(argv):\n    ", "max_tokens": 40, "temperature": 0,
                "ignore_eos": True}
        got = httpx.post(f"http://127.0.0.1:{http_port}/v1/completions", json=body, timeout=120).json()
        ar = engine_from_folders(TINY_TARGET, None, "ar").generate([body["prompt"]],
                                                                    SamplingParams(max_tokens=40, ignore_eos=True))
        assert got["choices"][0]["text"] == ar[0].text
        status = httpx.get(f"http://127.0.0.1:{http_port}/health", timeout=5).json()
        assert status["draft_state"] == "drafting" and status["accepted_total"] > 0
        proc.send_signal(signal.SIGINT)
        output, _ = proc.communicate(timeout=60)
        assert "draft eagle" in output and proc.returncode == 0
    finally:
        if proc.poll() is None:
            proc.kill()
