"""A plain step's graph keeps its logits in the head's dtype and the copy out of the graph widens them
(engine/runner.py `graph_step`, engine/cuda_graphs.py `replay`): the caller gets float32 logits equal to the
eager step's, and a subclass's own step is captured as it is. Runs the staged (uncaptured) steps on the CPU."""

from __future__ import annotations

import torch

from minedraft.bundled import TINY_TARGET
from minedraft.engine.cuda_graphs import GraphCache
from minedraft.engine.loader import load_model
from minedraft.engine.runner import ModelRunner


class StagedCache(GraphCache):
    """Steps staged over static buffers and run as they are (no CUDA graph on this machine)."""

    def _capture(self, key: tuple[int, int, int]):  # type: ignore[override]
        step = self.stage(key)
        step.run()
        self.steps[key] = step
        return step


def runner(dtype: torch.dtype, cls: type[ModelRunner] = ModelRunner) -> ModelRunner:
    out = cls(load_model(TINY_TARGET, "cpu", dtype), 64, 16, "cpu")
    out.graphs = StagedCache(out.graph_step, torch.device("cpu"), out.max_blocks_per_seq)
    return out


def verify_window(r: ModelRunner, seq: int) -> torch.Tensor:
    prompt = [5, 9, 2, 40, 7, 11, 3, 8]
    r.graphs, graphs = None, r.graphs  # the prompt's prefill eagerly
    r.forward([seq], [prompt[:-1]], [0], last_n=1)
    r.graphs = graphs
    return r.forward_ids([seq], torch.tensor([[prompt[-1], 12, 13, 14]]), [len(prompt) - 1], [4], last_n=4)


def test_a_plain_steps_buffer_is_bf16_and_the_caller_gets_the_eager_float32_logits() -> None:
    graphed = runner(torch.bfloat16)
    got = verify_window(graphed, 1)
    assert graphed.graphs is not None and graphed.graphs.replays == 1
    buffer = next(iter(graphed.graphs.steps.values())).logits
    assert buffer.dtype == torch.bfloat16 and got.dtype == torch.float32
    eager = runner(torch.bfloat16)
    eager.graphs = None
    want = verify_window(eager, 1)
    assert want.dtype == torch.float32 and torch.equal(got, want)
    assert got.data_ptr() != buffer.data_ptr()  # a copy: the next replay cannot overwrite it


def test_a_subclass_with_its_own_step_is_captured_as_it_is() -> None:
    class OwnStep(ModelRunner):
        def run(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            return super().run(*args, **kwargs) + 1.0

    graphed = runner(torch.bfloat16, OwnStep)
    got = verify_window(graphed, 1)
    assert graphed.graphs is not None
    assert next(iter(graphed.graphs.steps.values())).logits.dtype == torch.float32
    eager = runner(torch.bfloat16, OwnStep)
    eager.graphs = None
    assert torch.equal(got, verify_window(eager, 1))
