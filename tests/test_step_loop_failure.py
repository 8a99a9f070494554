"""A step loop that dies of an unexpected error (a bug) must not leave the server hanging: every request
ends with that error, /health says unavailable and why, new requests are refused, and `loop_failed` is
set, on which the batch manager's process exits non-zero so Kubernetes (or `minedraft serve`) restarts it."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from minedraft.batch_manager.backend import UnavailableError
from minedraft.batch_manager.plan_k import PlanK
from minedraft.core.tokenizer import Tokenizer
from tests.fake_worker_links import greedy
from tests.step_driver_support import Stack, drive, word_tokenizer
from tests.test_step_driver import PROMPTS, all_right, config


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    return word_tokenizer(Path(tmp_path_factory.mktemp("tok")))


async def break_midway(stack: Stack, method: str, error: Exception, message: str) -> None:
    """A request streams its first tokens, then PlanK's `method` raises `error`: the rest of the stream
    must end with UnavailableError matching `message` (not hang)."""
    await stack.coordinator.start()
    stream = stack.stream(PROMPTS[0], 30)
    assert (await anext(stream)).token_ids == greedy(PROMPTS[0], 3)

    def broken(*args: object, **kwargs: object) -> int:
        raise error

    setattr(stack.driver.k_plan, method, broken)
    with pytest.raises(UnavailableError, match=message):
        async for _ in stream:
            pass
    assert stack.coordinator.loop_failed.is_set()


def test_a_failed_step_loop_ends_every_request_and_reports_why(tokenizer: Tokenizer,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> None:
        stack = Stack(tokenizer, config("psd"), all_right)
        await break_midway(stack, "for_plan", RuntimeError("a bug in the loop"),
                           r"step loop failed \(RuntimeError: a bug in the loop\)")
        status = stack.coordinator.status()
        assert status["status"] == "unavailable" and "exits to be restarted" in str(status["reason"])
        assert (status["running"], status["waiting"]) == (0, 0)
        with pytest.raises(UnavailableError):
            await anext(stack.stream(PROMPTS[1], 5))
        await stack.coordinator.stop()

    drive(scenario)
    assert any(r.levelno == logging.ERROR and r.exc_info for r in caplog.records)  # the traceback is logged


@pytest.mark.parametrize("handler", ["on_verify", "on_draft"])  # inside the verifier's / the draft's event handling
def test_an_error_while_handling_a_workers_event_ends_every_request(tokenizer: Tokenizer, handler: str) -> None:
    """An error inside an event handler used to end that stream's reader quietly: no event of the worker was
    handled again and every request hung."""
    async def scenario() -> None:
        stack = Stack(tokenizer, config("psd"), all_right)
        await break_midway(stack, handler, KeyError("a bug in the bookkeeping"),
                           r"event handling failed \(KeyError: 'a bug in the bookkeeping'\)")
        assert stack.coordinator.status()["status"] == "unavailable"
        assert stack.driver.fault == stack.coordinator.fail  # the hook every stream's handler reports to
        await stack.coordinator.stop()

    drive(scenario)


def test_a_loop_that_stops_normally_is_not_a_failure(tokenizer: Tokenizer) -> None:
    async def scenario() -> None:
        stack = Stack(tokenizer, config("psd"), all_right)
        await stack.coordinator.start()
        out = [t for chunk in [c async for c in stack.stream(PROMPTS[0], 6)] for t in chunk.token_ids]
        assert out == greedy(PROMPTS[0], 6)
        await stack.coordinator.stop()
        assert not stack.coordinator.loop_failed.is_set() and stack.coordinator.status()["status"] != "unavailable"

    drive(scenario)


def test_the_debug_explanation_survives_a_plan_without_a_draft_batch(caplog: pytest.LogCaptureFixture) -> None:
    """A drafting plan can carry no sequence to draft (only removals): the DEBUG line must not fail it."""
    caplog.set_level(logging.DEBUG, logger="minedraft.batch_manager.plan_k")
    plan = PlanK(lambda: True, lambda s: 10, lambda: False)
    assert plan.for_plan(0, "auto", 4, True, draft_batch=[], verify_batch=[]) == 4
