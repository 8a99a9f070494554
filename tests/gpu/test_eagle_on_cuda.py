"""EAGLE drafting on the GPU path (Triton attention, bfloat16, CUDA graphs on both sides): greedy SD with a head
equals AR token for token, for the bundled EAGLE-1 head and the synthetic EAGLE-3 head, whose acceptance is the
draft model's at the same agreement; the capturing verifier's replayed steps give the eager step's features and
greedy tokens, the head's replayed first forwards (rows shorter than the graph's width among them) and feedback
forwards its logits and states; after capture_ahead every steady verify, first and feedback forward replays and
nothing is captured while serving (CUDA only; skipped elsewhere)."""

from __future__ import annotations

import pytest
import torch

from minedraft.bench.synthetic_eagle import build_synthetic_head, head_prompts, head_runners, head_vocabulary
from minedraft.bench.synthetic_pair import SyntheticSpec, build_synthetic
from minedraft.bundled import TINY_EAGLE, TINY_TARGET
from minedraft.core.sampling_params import SamplingParams
from minedraft.core.tokenizer import Tokenizer
from minedraft.engine.cuda_graphs import MAX_GRAPH_WIDTH, GraphCache
from minedraft.engine.drafter import Drafter
from minedraft.engine.eagle_head import EagleHead
from minedraft.engine.eagle_runner import EagleRunner
from minedraft.engine.hidden_capture import CapturingRunner
from minedraft.engine.llm_engine import EngineConfig, LLMEngine, Request
from minedraft.engine.model import CausalLM
from minedraft.engine.runner import ModelRunner
from minedraft.engine.verifier import Verifier
from tests.conftest import engine_from_folders
from tests.test_eagle_graphs import count_steps, first_widths

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
PARAMS = SamplingParams(max_tokens=48, ignore_eos=True)


@pytest.mark.skipif(not (TINY_EAGLE / "config.json").exists(), reason="bundled head not built")
def test_the_bundled_head_on_cuda_equals_ar() -> None:
    prompts = ["def main(argv):\n    ", "import os\nimport sys\n\n\nclass ", "    return self._", "x = "]
    ar = engine_from_folders(TINY_TARGET, None, "ar", device="cuda", dtype=torch.bfloat16).generate(prompts, PARAMS)
    engine = engine_from_folders(TINY_TARGET, TINY_EAGLE, "sd", k=4, draft_kind="eagle", device="cuda",
                                 dtype=torch.bfloat16)
    sd = engine.generate(prompts, PARAMS)
    assert [r.output_ids for r in sd] == [r.output_ids for r in ar]
    assert sum(r.stats.accepted for r in sd) > 0
    verify, feedback = engine.target.runner.graphs, engine.draft.runner.graphs  # type: ignore[union-attr]
    first = engine.draft.runner.first_graphs  # type: ignore[union-attr]
    assert verify is not None and verify.replays > 0  # the capturing verifier replayed its windows
    assert feedback is not None and feedback.replays > 0  # and the head its feedback forwards
    assert first is not None and first.replays > 0  # and its first forwards of 2.. tokens (EAGLE-1: 1 is a feedback)


def _generate(target: Verifier, drafter: Drafter | None, prompts: list[list[int]], k: int) -> list[Request]:
    cfg = EngineConfig(mode="sd" if drafter is not None else "ar", k=k, max_num_seqs=len(prompts), device="cuda")
    return LLMEngine(target, drafter, Tokenizer(TINY_TARGET), cfg).generate(prompts, PARAMS)


def test_the_synthetic_head_on_cuda_equals_ar_and_accepts_as_the_draft_model() -> None:
    target_spec, draft_spec = SyntheticSpec("tiny", "target", draft_layers=2, agree=0.7).pair()
    target = build_synthetic(target_spec, "cuda", torch.bfloat16)
    draft = build_synthetic(draft_spec, "cuda", torch.bfloat16)
    head = build_synthetic_head(target, 0.7, 256)
    prompts = head_prompts(head_vocabulary(512, 256, 0).closed, 16, 24, seed=5)
    ar = _generate(Verifier(ModelRunner(target, 512, 16, "cuda")), None, prompts, 1)
    accepted = {}
    for k in (1, 4, 6):
        capture, drafter = head_runners(target, head, 512)
        sd = _generate(Verifier(capture), drafter, prompts, k)
        assert [r.output_ids for r in sd] == [r.output_ids for r in ar], k
        accepted[k] = sum(r.stats.accepted for r in sd) / sum(r.stats.drafted for r in sd)
    model = _generate(Verifier(ModelRunner(target, 512, 16, "cuda")), Drafter(ModelRunner(draft, 512, 16, "cuda")),
                      prompts, 4)
    assert [r.output_ids for r in model] == [r.output_ids for r in ar]
    by_model = sum(r.stats.accepted for r in model) / sum(r.stats.drafted for r in model)
    assert abs(accepted[4] - by_model) <= 0.05


def _synthetic() -> tuple[CausalLM, EagleHead, list[list[int]]]:
    target_spec, _ = SyntheticSpec("tiny", "target", draft_layers=2, agree=0.7).pair()
    target = build_synthetic(target_spec, "cuda", torch.bfloat16)
    head = build_synthetic_head(target, 0.7, 256)
    return target, head, head_prompts(head_vocabulary(512, 256, 0).closed, 16, 24, seed=5)


def _sure_tokens_equal(got: torch.Tensor, want: torch.Tensor, margin: float = 0.05) -> None:
    """Greedy tokens equal wherever the eager step's top two are more than `margin` apart (bf16 ties aside)."""
    top = want.topk(2, dim=-1).values
    sure = (top[..., 0] - top[..., 1]) > margin
    assert sure.any()
    assert torch.equal(got.argmax(-1)[sure], want.argmax(-1)[sure])


def test_replayed_steps_on_both_sides_equal_the_eager_ones() -> None:
    target, head, prompts = _synthetic()
    batch = 3  # below its bucket: a zero-length row past it
    prompts = prompts[:batch]
    graphed = CapturingRunner(target, 512, 16, "cuda", head.eagle.aux_layers)
    eager = CapturingRunner(target, 512, 16, "cuda", head.eagle.aux_layers, cuda_graphs=False)
    assert graphed.graphs is not None and eager.graphs is None
    assert graphed.capture_ahead(4, 4, scoring=True) == 3 * 5  # buckets 1, 2, 4 x windows of 1..5
    seq_ids, starts = list(range(batch)), [len(p) for p in prompts]
    for runner in (graphed, eager):
        runner.forward(seq_ids, prompts, [0] * batch, last_n=1)  # 24 wide: eager in both
    gen = torch.Generator().manual_seed(0)
    for width in (5, 1, 3):
        ids = torch.randint(0, 512, (batch, width), generator=gen).cuda()
        got = graphed.forward_ids(seq_ids, ids, starts, [width] * batch, last_n=width)
        want = eager.forward_ids(seq_ids, ids, starts, [width] * batch, last_n=width)
        torch.testing.assert_close(got, want, rtol=2e-2, atol=5e-2)
        _sure_tokens_equal(got, want)
        starts = [s + width - 1 for s in starts]
    assert graphed.graphs.replays == 3 and len(graphed.graphs.steps) == 15  # nothing captured while serving
    got_rows, want_rows = graphed.take_hidden(seq_ids), eager.take_hidden(seq_ids)
    assert got_rows is not None and want_rows is not None and got_rows.counts == want_rows.counts
    assert got_rows.rows.dtype == torch.bfloat16 and got_rows.rows.shape[1] == 3 * target.config.hidden_size
    torch.testing.assert_close(got_rows.rows.float(), want_rows.rows.float(), rtol=5e-2, atol=5e-2)

    heads = EagleRunner(head, 512, 16, "cuda"), EagleRunner(head, 512, 16, "cuda", cuda_graphs=False)
    assert heads[0].capture_ahead(4, 4) == 3 + 3 * 5 and heads[1].graphs is None  # feedback, first of 1..5 tokens
    first_graphs = heads[0].first_graphs
    assert first_graphs is not None
    reserve, lens = [40] * batch, [5, 3, 1]  # rows shorter than the graph's width
    taps = torch.randn((batch, 5, head.eagle.feature_width), generator=gen).cuda()
    first = torch.randint(0, 512, (batch, 5), generator=gen).cuda()
    outs = [r.forward_features(seq_ids, first, taps, [0] * batch, lens, reserve) for r in heads]
    assert first_graphs.replays == 1 and heads[0].graphs is not None and heads[0].graphs.replays == 0
    torch.testing.assert_close(outs[0][1].float(), outs[1][1].float(), rtol=2e-2, atol=5e-2)
    _sure_tokens_equal(outs[0][0], outs[1][0])
    position = torch.tensor(lens, device="cuda")
    ones = torch.ones(batch, dtype=torch.long, device="cuda")
    for step in range(3):
        token = outs[1][0].argmax(-1)  # the eager head's draft, fed to both
        outs = [r.forward_features(seq_ids, token, out[1], position + step, ones, reserve)
                for r, out in zip(heads, outs, strict=True)]
        torch.testing.assert_close(outs[0][1].float(), outs[1][1].float(), rtol=2e-2, atol=5e-2)
        _sure_tokens_equal(outs[0][0], outs[1][0])
    assert heads[0].graphs.replays == 3 and first_graphs.replays == 1 and len(first_graphs.steps) == 15


def test_after_capture_ahead_greedy_sd_replays_every_steady_step_and_equals_ar() -> None:
    target, head, prompts = _synthetic()
    ar = _generate(Verifier(ModelRunner(target, 512, 16, "cuda")), None, prompts, 1)
    capture, drafter = head_runners(target, head, 512)
    verify, feedback, first = capture.graphs, drafter.runner.graphs, drafter.head_runner.first_graphs
    assert verify is not None and feedback is not None and first is not None
    capture.capture_ahead(len(prompts), 4, scoring=True)
    drafter.runner.capture_ahead(len(prompts), 4)
    captured_ms = verify.capture_ms, feedback.capture_ms, first.capture_ms
    widths, ks = count_steps(capture, drafter)
    firsts = first_widths(drafter)
    sd = _generate(Verifier(capture), drafter, prompts, 4)
    assert [r.output_ids for r in sd] == [r.output_ids for r in ar]
    assert sum(r.stats.accepted for r in sd) > 0
    steady = [w for w in widths if w <= MAX_GRAPH_WIDTH]
    assert len(steady) >= len(widths) - 1 and verify.replays == len(steady) > 0  # all but the prompts' prefill
    assert feedback.replays == sum(k - 1 for k in ks) > 0  # every feedback forward
    assert len(firsts) == len(ks) and first.replays == sum(w <= 5 for w in firsts) >= len(ks) - 1  # all but the first
    assert (verify.capture_ms, feedback.capture_ms, first.capture_ms) == captured_ms  # nothing captured while serving
    assert not verify.eager and not feedback.eager and not first.eager
    assert GraphCache.bucket(len(prompts)) in {key[0] for key in feedback.steps}

