"""CUDA graphs on both sides of EAGLE, checked on the CPU with staged graphs (the static buffers a graph replays
over and the step over them, without a capture): the capturing verifier records after a replay the features the
eager step records, the head's first forwards (rows shorter than the graph's width among them) and feedback
forwards give what the eager step gives, capture_ahead names each side's steady shapes, and greedy SD through both
sides' graphs equals AR with every steady step replayed (tests/gpu/test_eagle_on_cuda.py replays real graphs)."""

from __future__ import annotations

from dataclasses import replace

import torch

from minedraft.bench.synthetic_eagle import (
    build_synthetic_head,
    head_config,
    head_prompts,
    head_runners,
    head_vocabulary,
)
from minedraft.bench.synthetic_pair import SyntheticSpec, build_synthetic
from minedraft.bundled import TINY_TARGET
from minedraft.core.sampling_params import SamplingParams
from minedraft.core.tokenizer import Tokenizer
from minedraft.engine.cuda_graphs import MAX_GRAPH_WIDTH, CapturedStep, GraphCache
from minedraft.engine.eagle_drafter import EagleDrafter
from minedraft.engine.eagle_head import EagleHead
from minedraft.engine.eagle_runner import EagleRunner
from minedraft.engine.hidden_capture import CapturingRunner
from minedraft.engine.llm_engine import EngineConfig, LLMEngine, Request
from minedraft.engine.model import CausalLM
from minedraft.engine.runner import ModelRunner
from minedraft.engine.verifier import Verifier

DRAFT_VOCAB = 256  # of the tiny shape's 512
PARAMS = SamplingParams(max_tokens=32, ignore_eos=True)


class StagedCache(GraphCache):
    """A GraphCache whose 'capture' keeps the static buffers and the step over them: a replay runs the step on
    exactly the inputs (bucket rows, zero-length rows past the batch) a graph would read."""

    def _capture(self, key: tuple[int, int, int]) -> CapturedStep:
        self.steps[key] = self.stage(key)
        return self.steps[key]


def staged(runner: ModelRunner) -> StagedCache:
    assert runner.graphs is None  # no graphs on a CPU
    runner.graphs = StagedCache(runner.graph_step, torch.device("cpu"), runner.max_blocks_per_seq)
    if isinstance(runner, EagleRunner):
        runner.stage_graphs(StagedCache(runner.first_graph_step, torch.device("cpu"), runner.max_blocks_per_seq))
    return runner.graphs


def target_and_head() -> tuple[CausalLM, torch.nn.Module]:
    spec, _ = SyntheticSpec("tiny", "target", draft_layers=2, agree=0.7).pair()
    target = build_synthetic(spec, "cpu", torch.float32)
    return target, build_synthetic_head(target, 0.7, DRAFT_VOCAB)


def prompts_for(batch: int, seed: int) -> list[list[int]]:
    return head_prompts(head_vocabulary(512, DRAFT_VOCAB, 0).closed, batch, 20, seed=seed)


def test_a_replayed_capturing_step_records_the_eager_features() -> None:
    target, head = target_and_head()
    taps = head.eagle.aux_layers
    for batch in (3, 4):  # below its bucket (a zero-length row past it) and a full one
        graphed, eager = (CapturingRunner(target, 128, 16, "cpu", taps) for _ in range(2))
        graphs = staged(graphed)
        prompts = prompts_for(batch, seed=batch)
        seq_ids, starts = list(range(batch)), [len(p) for p in prompts]
        for runner in (graphed, eager):
            runner.forward(seq_ids, prompts, [0] * batch, last_n=1)  # wider than any graph: eager in both
        assert graphs.replays == 0
        rng = torch.Generator().manual_seed(batch)
        for width in (5, 1, 3):  # verify windows and an AR step
            ids = torch.randint(0, 512, (batch, width), generator=rng)
            got = graphed.forward_ids(seq_ids, ids, starts, [width] * batch, last_n=width)
            want = eager.forward_ids(seq_ids, ids, starts, [width] * batch, last_n=width)
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
            starts = [s + width - 1 for s in starts]  # the last token is fed again, as after a rejection
        assert graphs.replays == 3
        got_rows, want_rows = graphed.take_hidden(seq_ids), eager.take_hidden(seq_ids)
        assert got_rows is not None and want_rows is not None
        assert got_rows.starts == want_rows.starts == [0] * batch
        assert got_rows.counts == want_rows.counts == [s + 1 for s in starts]  # through the last window
        assert got_rows.rows.shape == (sum(starts) + batch, 3 * target.config.hidden_size)
        torch.testing.assert_close(got_rows.rows, want_rows.rows, rtol=1e-5, atol=1e-5)


def first_forward(runners: tuple[EagleRunner, ...], lens: list[int], width: int, seed: int, start: int = 0
                  ) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Each runner's first forward of rows of `lens` tokens (padded to `width`, features zero past a row's end, as
    the stash gathers them) at `start`: (logits, hidden) each."""
    head = runners[0].head
    rng = torch.Generator().manual_seed(seed)
    batch, lengths = len(lens), torch.tensor(lens)
    ids = torch.randint(0, 512, (batch, width), generator=rng)
    taps = torch.randn((batch, width, head.eagle.feature_width), generator=rng)
    taps[torch.arange(width) >= lengths[:, None]] = 0
    seq_ids, reserve = list(range(batch)), [start + 40] * batch
    return [r.forward_features(seq_ids, ids, taps, [start] * batch, lens, reserve) for r in runners]


def assert_same(got: tuple[torch.Tensor, torch.Tensor], want: tuple[torch.Tensor, torch.Tensor]) -> None:
    """The same logits and hidden states, bit for bit (a staged step computes on the CPU what the eager one does)."""
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_a_replayed_first_forward_equals_the_eager_one() -> None:
    _, head = target_and_head()
    for lens in ([5, 2, 1], [1, 3, 5, 4]):  # below its bucket (a zero-length row past it) and a full one
        graphed, eager = (EagleRunner(head, 64, 16, "cpu") for _ in range(2))
        feedback, first = staged(graphed), graphed.first_graphs
        assert isinstance(first, StagedCache)
        assert graphed.capture_ahead(4, 4) == 3 + 3 * 5  # buckets 1, 2, 4: the feedback's and Q = 1..5
        got, want = first_forward((graphed, eager), lens, 5, seed=len(lens))
        assert_same(got, want)
        assert first.replays == 1 and feedback.replays == 0
        again = first_forward((graphed, eager), [1] * len(lens), 1, seed=1, start=5)  # Q = 1: the target's taps
        assert_same(*again)
        assert first.replays == 2 and feedback.replays == 0
        token, ones = torch.zeros((len(lens), 1), dtype=torch.long), torch.ones(len(lens), dtype=torch.long)
        fed = [r.forward_features(list(range(len(lens))), token, out[1], torch.full((len(lens),), 6), ones,
                                  [45] * len(lens)) for r, out in zip((graphed, eager), again, strict=True)]
        assert_same(*fed)
        assert feedback.replays == 1
        assert_same(got, want)  # cloned out of the logits buffer every head graph writes
        wide = first_forward((graphed, eager), [6] * len(lens), 6, seed=2, start=7)  # outside the captured set
        assert_same(*wide)
        assert first.replays == 2 and first.eager == {(4, 6, 1)}


def test_a_replayed_feedback_forward_equals_the_eager_one() -> None:
    _, head = target_and_head()
    graphed, eager = (EagleRunner(head, 64, 16, "cpu") for _ in range(2))
    graphs = staged(graphed)
    batch, h = 3, head.config.hidden_size
    rng = torch.Generator().manual_seed(0)
    seq_ids, reserve = list(range(batch)), [40] * batch
    outs = first_forward((graphed, eager), [6] * batch, 6, seed=0)
    assert graphs.replays == 0  # the first forward (the target's states) replays a graph of its own
    position = torch.full((batch,), 6, dtype=torch.long)
    for step in range(3):
        token = torch.randint(0, 512, (batch, 1), generator=rng)
        ones = torch.ones(batch, dtype=torch.long)
        outs = [runner.forward_features(seq_ids, token, out[1], position + step, ones, reserve)
                for runner, out in zip((graphed, eager), outs, strict=True)]
        assert outs[0][1].shape == (batch, 1, h)
        assert_same(*outs)
    assert graphs.replays == 3 and list(graphs.steps) == [(4, 1, 1)]


def eagle1_head(target: CausalLM) -> EagleHead:
    """An EAGLE-1 head of random weights: its features are the target's last hidden state, as wide as its own."""
    head = EagleHead.empty(replace(head_config(target.config), version=1), "cpu", torch.float32)
    rng = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for param in head.parameters():
            param.copy_(torch.randn(param.shape, generator=rng) * param.shape[-1] ** -0.5)
    return head.fuse_projections().eval()


def test_an_eagle1_heads_one_token_first_forward_replays_a_feedback_graph() -> None:
    target, _ = target_and_head()
    head = eagle1_head(target)
    graphed, eager = EagleRunner(head, 64, 16, "cpu"), EagleRunner(head, 64, 16, "cpu")
    feedback = staged(graphed)
    assert graphed.capture_ahead(2, 2) == 2 + 2 * 2  # the first forwards of 2 and 3 tokens only
    assert graphed.first_graphs is not None and list(graphed.first_graphs.steps) == [(1, 2, 1), (1, 3, 1),
                                                                                      (2, 2, 1), (2, 3, 1)]
    assert_same(*first_forward((graphed, eager), [1, 1], 1, seed=3))
    assert_same(*first_forward((graphed, eager), [3, 2], 3, seed=4, start=1))
    assert feedback.replays == 1 and graphed.first_graphs.replays == 1


def test_capture_ahead_names_each_sides_steady_shapes() -> None:
    target, head = target_and_head()
    capture, drafter = head_runners(target, head, 64)
    assert capture.capture_ahead(8, 2, scoring=True) == 0 and drafter.runner.capture_ahead(8, 2, False) == 0
    verify, feedback = staged(capture), staged(drafter.runner)
    assert capture.capture_ahead(8, 2, True, selection=(3, 1)) == 12  # no packed verifies: the step is its own
    assert list(verify.steps) == [(b, w, w) for b in (1, 2, 4, 8) for w in (1, 2, 3)] and verify.closed
    runner, buckets = drafter.head_runner, (1, 2, 4, 8, 16, 24)
    assert runner.capture_ahead(20, 4, False) == 6 + 6 * 5
    assert list(feedback.steps) == [(b, 1, 1) for b in buckets] and feedback.closed
    first = runner.first_graphs
    assert first is not None and first.closed and list(first.steps) == [(b, w, 1) for b in buckets for w in range(1, 6)]
    assert runner.first_in is not None and runner.first_in.numel() == 24 * 5 * head.eagle.feature_width  # one, shared
    assert runner.capture_ahead(2, 20) == 2 * (MAX_GRAPH_WIDTH - 5)  # widths past k + 1 = 5, up to the graphs' limit
    assert max(key[1] for key in first.steps) == MAX_GRAPH_WIDTH


def generate(target: Verifier, drafter: EagleDrafter | None, prompts: list[list[int]], k: int) -> list[Request]:
    cfg = EngineConfig(mode="sd" if drafter is not None else "ar", k=k, device="cpu", dtype=torch.float32)
    return LLMEngine(target, drafter, Tokenizer(TINY_TARGET), cfg).generate(prompts, PARAMS)


def test_greedy_sd_through_both_sides_graphs_equals_ar_with_every_steady_step_replayed() -> None:
    target, head = target_and_head()
    prompts = prompts_for(6, seed=5)
    ar = generate(Verifier(ModelRunner(target, 128, 16, "cpu")), None, prompts, 1)
    eager = generate(Verifier(CapturingRunner(target, 128, 16, "cpu", head.eagle.aux_layers)),
                     EagleDrafter(EagleRunner(head, 128, 16, "cpu")), prompts, 4)
    capture, drafter = head_runners(target, head, 128)
    verify, feedback = staged(capture), staged(drafter.runner)
    capture.capture_ahead(8, 4, scoring=True)
    drafter.runner.capture_ahead(8, 4)
    first = drafter.head_runner.first_graphs
    assert first is not None
    widths, ks = count_steps(capture, drafter)
    firsts = first_widths(drafter)
    sd = generate(Verifier(capture), drafter, prompts, 4)
    assert [r.output_ids for r in sd] == [r.output_ids for r in ar]
    assert [r.stats.accepted for r in sd] == [r.stats.accepted for r in eager]  # the same features, the same drafts
    assert sum(r.stats.accepted for r in sd) > 0
    steady = [w for w in widths if w <= MAX_GRAPH_WIDTH]
    assert len(steady) >= len(widths) - 1 and verify.replays == len(steady) > 0  # all but the prompts' prefill
    assert feedback.replays == sum(k - 1 for k in ks) > 0  # every feedback forward
    assert len(firsts) == len(ks) and first.replays == sum(w <= 5 for w in firsts) >= len(ks) - 1  # all but the first
    assert not verify.eager and not feedback.eager and not first.eager  # nothing outside the closed sets


def first_widths(drafter: EagleDrafter) -> list[int]:
    """Record the width of each proposal's first forward (the list fills as the engine runs)."""
    widths: list[int] = []
    runner = drafter.head_runner
    forward = runner.forward_features

    def counted(seq_ids, ids, features, *args):  # type: ignore[no-untyped-def]
        if features.shape[-1] == runner.feature_width:
            widths.append(ids.shape[1])
        return forward(seq_ids, ids, features, *args)

    runner.forward_features = counted  # type: ignore[method-assign]
    return widths


def count_steps(capture: CapturingRunner, drafter: EagleDrafter) -> tuple[list[int], list[int]]:
    """Record each verifier forward's width and each proposal's k (the lists fill as the engine runs)."""
    widths: list[int] = []
    ks: list[int] = []
    forward, propose = capture.forward_on_device, drafter.propose

    def counted_forward(seq_ids, ids, *args):  # type: ignore[no-untyped-def]
        widths.append(ids.shape[1])
        return forward(seq_ids, ids, *args)

    def counted_propose(seq_ids: list[int], k: int):  # type: ignore[no-untyped-def]
        ks.append(k)
        return propose(seq_ids, k)

    capture.forward_on_device = counted_forward  # type: ignore[method-assign]
    drafter.propose = counted_propose  # type: ignore[method-assign]
    return widths, ks
