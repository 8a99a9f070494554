"""AR steps launched ahead (verifier/ar_ahead.py) and SD colocated's drafts queued behind the verify
(verifier/colocated_ahead.py), through the verifier's own executor.

The same plans run on an executor that launches AR steps ahead and on one that does not: every event's
tokens must be equal (greedy and seeded sampled rows; penalised rows, launched with the uncommitted token
in their history; rows with logprobs, whose logprobs must be equal too; membership changes in between), steps
must really be launched ahead, each step must read back exactly once, and a commit must keep the KV block the
launched step writes."""

from __future__ import annotations

from minedraft.engine.drafter import Drafter
from minedraft.engine.loader import load_model
from minedraft.engine.readback import Readback
from minedraft.engine.runner import ModelRunner
from minedraft.engine.verifier import Verifier
from minedraft.proto import control_pb2
from minedraft.verifier.colocated import ColocatedDrafter
from minedraft.verifier.executor import VerifierExecutor

BLOCK = 4


def spec(seq_id: int, tokens: list[int], **sampling: float) -> control_pb2.SeqSpec:
    out = control_pb2.SeqSpec(seq_id=seq_id, tokens=tokens, prompt_len=len(tokens))
    out.sampling.top_p = 1.0
    for name, value in sampling.items():
        setattr(out.sampling, name, value)
    return out


def ar_plans() -> list[control_pb2.StepPlan]:
    """AR plans over a batch that changes: a removal, an addition, a penalised row and a logprobs row come
    and go, so some plans can be launched ahead and some cannot."""
    batches = {1: spec(1, [5, 9, 3]), 2: spec(2, [7, 7, 8, 2, 40, 41, 42], temperature=0.8, seed=3),
               3: spec(3, [60, 61]), 4: spec(4, [3, 1, 4, 1, 5], temperature=1.2, top_k=20, seed=9)}
    late = {5: spec(5, [11, 12, 13], repetition_penalty=1.3, frequency_penalty=0.5, presence_penalty=0.4),
            6: spec(6, [21, 22], logprobs=2), 7: spec(7, [8, 8, 8, 8, 8, 8, 8])}
    live = [1, 2, 3, 4]
    plans = [control_pb2.StepPlan(step=0, verify_batch=live, add=[batches[s] for s in live])]
    schedule = {6: ("remove", 3), 9: ("add", 7), 12: ("add", 5), 17: ("remove", 5), 20: ("add", 6),
                24: ("remove", 6)}
    for step in range(1, 30):
        plan = control_pb2.StepPlan(step=step)
        change = schedule.get(step)
        if change is not None and change[0] == "remove":
            live = [s for s in live if s != change[1]]
            plan.remove.append(change[1])
        elif change is not None:
            live = [*live, change[1]]
            plan.add.append(late[change[1]])
        plan.verify_batch.extend(live)
        plans.append(plan)
    return plans


def run(path, launch_ahead: bool) -> tuple[list[list], int, int, bool]:
    """Each event's tokens and logprobs, the steps launched ahead, the readbacks made, and whether every
    launched step's KV block survived the commit before it."""
    worker = Verifier(ModelRunner(load_model(path), 160, BLOCK))
    executor = VerifierExecutor(worker, None, "", 0, launch_ahead=launch_ahead)  # type: ignore[arg-type]
    plans = ar_plans()
    tokens: list[list[int]] = []
    logprobs: list[list[bytes]] = []  # each event's logprobs entries, as they go out
    readbacks = [0]
    original = Readback.__init__

    def counting(self: Readback, *args: object, **kwargs: object) -> None:
        readbacks[0] += 1
        original(self, *args, **kwargs)  # type: ignore[arg-type]

    kept = True
    Readback.__init__ = counting  # type: ignore[method-assign]
    try:
        for i, plan in enumerate(plans):
            executor.upcoming = lambda i=i: plans[i + 1] if i + 1 < len(plans) else None
            event = executor.handle_plan(plan)
            tokens.append(list(event.verdicts.tokens))
            logprobs.append([entry.SerializeToString() for entry in event.verdicts.logprobs])
            launched = executor.launched
            if launched is not None:
                alloc = worker.runner.allocator
                kept &= all(len(alloc.table(s)) >= alloc.blocks_for(worker.seqs[s].length) for s in launched.ids)
    finally:
        Readback.__init__ = original  # type: ignore[method-assign]
    assert any(logprobs), "the logprobs row's entries come back"
    return [t + lp for t, lp in zip(tokens, logprobs, strict=True)], executor.launched_count, readbacks[0], kept


def test_ar_launched_ahead_equals_plain_ar_token_for_token(random_pair) -> None:
    target, _ = random_pair
    plain, plain_launched, plain_reads, _ = run(target, launch_ahead=False)
    ahead, launched, reads, kept = run(target, launch_ahead=True)
    assert ahead == plain
    assert plain_launched == 0
    plans = ar_plans()
    blocked = sum(1 for p in plans[1:] if p.add or p.remove)  # logprobs and penalised rows' plans launch too
    assert launched >= len(plans) - 1 - blocked - 2 and launched > 10
    # One readback per plain step; a logprobs row adds its own.
    logprob_steps = sum(1 for p in plans if 6 in p.verify_batch)
    assert plain_reads == reads == len(plans) + logprob_steps
    assert kept


def test_a_plan_that_changes_the_batch_is_not_launched(random_pair) -> None:
    target, _ = random_pair
    worker = Verifier(ModelRunner(load_model(target), 64, BLOCK))
    executor = VerifierExecutor(worker, None, "", 0, launch_ahead=True)  # type: ignore[arg-type]
    first = control_pb2.StepPlan(step=0, verify_batch=[1, 2], add=[spec(1, [5, 6]), spec(2, [7, 8, 9])])
    others = {
        "reordered": control_pb2.StepPlan(step=1, verify_batch=[2, 1]),
        "removes a row": control_pb2.StepPlan(step=1, verify_batch=[1], remove=[2]),
        "adds a row": control_pb2.StepPlan(step=1, verify_batch=[1, 2], add=[spec(3, [4])]),
        "sends its verdict": control_pb2.StepPlan(step=1, verify_batch=[1, 2], send_verdict=True),
        "verifies drafts": control_pb2.StepPlan(step=1, verify_batch=[1, 2], with_drafts=True, k=2),
        "not the next step": control_pb2.StepPlan(step=2, verify_batch=[1, 2]),
    }
    executor.upcoming = lambda: others["reordered"]
    executor.handle_plan(first)
    assert executor.launched is None
    for why, nxt in others.items():
        step = executor.last_step + 1
        plan = control_pb2.StepPlan(step=step, verify_batch=[1, 2])
        nxt = control_pb2.StepPlan.FromString(nxt.SerializeToString())
        nxt.step += step  # 1: the plan after this one
        executor.upcoming = lambda nxt=nxt: nxt
        executor.handle_plan(plan)
        assert executor.launched is None, why
    same = control_pb2.StepPlan(step=executor.last_step + 2, verify_batch=[1, 2])
    executor.upcoming = lambda: same
    executor.handle_plan(control_pb2.StepPlan(step=executor.last_step + 1, verify_batch=[1, 2]))
    assert executor.launched is not None and executor.launched.plan.step == same.step


def fused_run(pair, launch_ahead: bool) -> tuple[list[list[int]], int]:
    """SD colocated's fused cycle (verify the last drafts, draft again) over greedy and sampled rows: each
    event's tokens and how many plans drafted ahead (did not call `Drafter.propose`)."""
    target, draft = pair
    worker = Verifier(ModelRunner(load_model(target), 160, BLOCK))
    colocated = ColocatedDrafter(Drafter(ModelRunner(load_model(draft), 160, BLOCK)))
    executor = VerifierExecutor(worker, None, "", 0, colocated=colocated,  # type: ignore[arg-type]
                                launch_ahead=launch_ahead)
    ids = [1, 2, 3]
    adds = [spec(1, [5, 9, 3]), spec(2, [7, 7, 8, 2, 40], temperature=0.9, seed=4), spec(3, [60])]
    tokens: list[list[int]] = []
    proposals = [0]
    propose = colocated.drafter.propose

    def counting(seq_ids: list[int], k: int) -> object:
        proposals[0] += 1
        return propose(seq_ids, k)

    colocated.drafter.propose = counting  # type: ignore[method-assign, assignment]
    for step in range(14):
        k = 3 if step < 7 else 2  # adaptive k changes the width between proposals
        plan = control_pb2.StepPlan(step=step, verify_batch=ids, k=k, with_drafts=True, draft_here=True,
                                    draft_batch=ids, add=adds if step == 0 else [])
        event = executor.handle_plan(plan)
        tokens.append(list(event.verdicts.tokens))
    return tokens, 14 - proposals[0]


def test_sd_colocated_drafting_ahead_equals_the_ordinary_cycle(random_pair) -> None:
    plain, none_ahead = fused_run(random_pair, launch_ahead=False)
    ahead, drafted_ahead = fused_run(random_pair, launch_ahead=True)
    assert ahead == plain and none_ahead == 0
    assert drafted_ahead >= 12  # every cycle after the first (which verifies no drafts) drafts ahead
