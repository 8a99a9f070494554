"""Each processed verify slot equals a sequential reference over the committed output plus the drafts before it."""

from __future__ import annotations

import torch

from minedraft.core.sampling_params import SamplingParams
from minedraft.engine.logits_processing import LogitsProcessing
from minedraft.engine.sequence import SeqState

VOCAB = 11


def reference_row(logits: torch.Tensor, prompt: list[int], output: list[int], p: SamplingParams) -> torch.Tensor:
    """The definitions, one position at a time, written without the module's tensors."""
    x = logits.double().clone()
    if p.allowed_token_ids:
        keep = set(p.allowed_token_ids)
        for t in range(VOCAB):
            if t not in keep:
                x[t] = float("-inf")
    if len(output) < p.min_tokens:
        for t in p.stop_token_ids:
            x[t] = float("-inf")
    for t, b in p.logit_bias.items():
        x[t] += b
    for t in set(prompt) | set(output):
        x[t] = x[t] / p.repetition_penalty if x[t] > 0 else x[t] * p.repetition_penalty
    for t in set(output):
        x[t] -= p.frequency_penalty * output.count(t) + p.presence_penalty
    return x


def test_every_slot_sees_the_committed_output_and_the_drafts_before_it() -> None:
    torch.manual_seed(0)
    params = [
        SamplingParams(repetition_penalty=1.3, frequency_penalty=0.7, presence_penalty=-0.4),
        SamplingParams(),  # untouched row in the same batch
        SamplingParams(logit_bias={2: 3.0, 5: -1.5}, min_tokens=5, stop_token_ids=[1, 4], frequency_penalty=2.0),
        SamplingParams(allowed_token_ids=[0, 3, 6, 7], presence_penalty=1.0),
    ]
    prompts = [[3, 3, 5], [1, 2], [7, 8, 9], [6]]
    outputs = [[5, 2, 2], [4], [2], []]
    drafts = torch.tensor([[2, 2, 9], [0, 1, 2], [1, 2, 2], [7, 7, 3]])
    states = [SeqState(i, pr + out, p, cached=len(pr + out) - 1, prompt_len=len(pr))
              for i, (pr, out, p) in enumerate(zip(prompts, outputs, params, strict=True))]
    logits = torch.randn(4, 4, VOCAB) * 3
    processing = LogitsProcessing(VOCAB, torch.device("cpu"))
    got = processing.apply(logits, states, drafts)
    for b in range(4):
        for slot in range(4):
            history = outputs[b] + drafts[b, :slot].tolist()
            expected = reference_row(logits[b, slot], prompts[b], history, params[b])
            assert torch.allclose(got[b, slot].double(), expected, atol=1e-5), (b, slot)
    assert torch.equal(got[1], logits[1])


def test_min_tokens_masks_stop_ids_exactly_while_the_output_is_short() -> None:
    """Committed output of 2 tokens, min_tokens 4: slots 0 and 1 (2 and 3 tokens before them) cannot stop,
    slot 2 (4 before it) and later can, whatever the drafts at those slots are."""
    p = SamplingParams(min_tokens=4, stop_token_ids=[1])
    st = SeqState(0, [5, 6, 8, 9], p, cached=3, prompt_len=2)
    logits = torch.zeros(1, 4, VOCAB)
    got = LogitsProcessing(VOCAB, torch.device("cpu")).apply(logits, [st], torch.tensor([[1, 1, 1]]))
    assert got[0, :, 1].tolist() == [float("-inf"), float("-inf"), 0.0, 0.0]
    assert torch.isfinite(got[0, :, [0, *range(2, VOCAB)]]).all()


def test_histories_follow_commits_and_are_forgotten_with_the_sequence() -> None:
    p = SamplingParams(frequency_penalty=1.0)
    st = SeqState(3, [4, 4], p, cached=1, prompt_len=2)
    processing = LogitsProcessing(VOCAB, torch.device("cpu"))
    processing.apply(torch.zeros(1, 1, VOCAB), [st], torch.zeros((1, 0), dtype=torch.long))
    st.tokens += [4, 6, 6]  # a verdict committed three tokens
    out = processing.apply(torch.zeros(1, 1, VOCAB), [st], torch.zeros((1, 0), dtype=torch.long))
    assert out[0, 0, 4].item() == -1.0 and out[0, 0, 6].item() == -2.0  # prompt tokens are not counted
    processing.forget(3)
    assert not processing.histories.slot and not processing.tables and processing.histories.free


def test_a_verify_slot_has_the_bits_a_plain_step_computes_after_committing_the_drafts_before_it() -> None:
    """SD == AR needs more than closeness: slot i of a verify must equal, bit for bit, the single slot a plain
    decode processes once drafts[:i] are committed (drafts repeating a token and a committed one included)."""
    torch.manual_seed(1)
    vocab = 64
    params = [SamplingParams(repetition_penalty=1.25, frequency_penalty=0.3, presence_penalty=0.7),
              SamplingParams(repetition_penalty=0.8, presence_penalty=-0.2),
              SamplingParams(frequency_penalty=1.1)]
    prompts, outputs = [[3, 9, 9], [1], [5, 6]], [[9, 4], [], [7, 7, 2]]
    drafts = torch.tensor([[4, 4, 11, 9], [1, 2, 1, 1], [63, 7, 0, 63]])
    logits = torch.randn(3, 5, vocab) * 4
    states = [SeqState(b, pr + out, p, cached=len(pr + out) - 1, prompt_len=len(pr))
              for b, (pr, out, p) in enumerate(zip(prompts, outputs, params, strict=True))]
    got = LogitsProcessing(vocab, torch.device("cpu")).apply(logits, states, drafts)
    for b in range(3):
        for slot in range(5):
            history = prompts[b] + outputs[b] + drafts[b, :slot].tolist()
            plain = SeqState(b, history, params[b], cached=len(history) - 1, prompt_len=len(prompts[b]))
            alone = LogitsProcessing(vocab, torch.device("cpu")).apply(
                logits[b:b + 1, slot:slot + 1], [plain], torch.zeros((1, 0), dtype=torch.long))
            assert torch.equal(got[b, slot], alone[0, 0]), (b, slot)


def test_a_pending_token_is_the_last_of_the_history_as_if_committed() -> None:
    """An AR step launched ahead of the previous step's commit processes its slot with that step's token as
    output already: the same bits as after the commit, min_tokens counted with it (3 tokens: stop id 2 free)."""
    torch.manual_seed(2)
    vocab = 32
    p = SamplingParams(repetition_penalty=1.4, frequency_penalty=0.6, presence_penalty=0.3, min_tokens=3,
                       stop_token_ids=[2])
    logits = torch.randn(1, 1, vocab) * 3
    none = torch.zeros((1, 0), dtype=torch.long)
    before = SeqState(0, [4, 5, 7, 9], p, cached=3, prompt_len=2)
    got = LogitsProcessing(vocab, torch.device("cpu")).apply(logits, [before], none, pending=torch.tensor([[9]]))
    after = SeqState(0, [4, 5, 7, 9, 9], p, cached=4, prompt_len=2)
    assert torch.equal(got, LogitsProcessing(vocab, torch.device("cpu")).apply(logits, [after], none))
    assert torch.isfinite(got[0, 0, 2])
    assert not torch.equal(got, LogitsProcessing(vocab, torch.device("cpu")).apply(logits, [before], none))


def test_each_sequence_counts_only_its_own_tokens_in_its_own_row() -> None:
    """The tables are updated through flat row x vocabulary indices: the second row's tokens land in its row."""
    p = SamplingParams(frequency_penalty=1.0, repetition_penalty=2.0)
    a = SeqState(1, [7, 2, 2], p, cached=2, prompt_len=1)
    b = SeqState(2, [9, 3, 2, 3, 3], p, cached=4, prompt_len=2)
    processing = LogitsProcessing(VOCAB, torch.device("cpu"))
    out = processing.apply(torch.ones(2, 1, VOCAB), [a, b], torch.zeros((2, 0), dtype=torch.long))
    histories = processing.histories
    counts = histories.counts[[histories.slot[1], histories.slot[2]]]
    assert counts[0].nonzero().flatten().tolist() == [2] and counts[0, 2] == 2
    assert counts[1].nonzero().flatten().tolist() == [2, 3] and counts[1].tolist()[2:4] == [1.0, 2.0]
    # a: 7 (prompt) seen, 2 counted twice; b: 9 and 3 (prompt) seen, 2 counted once, 3 twice
    assert out[0, 0, [7, 2, 3]].tolist() == [0.5, 0.5 - 2, 1.0]
    assert out[1, 0, [9, 2, 3, 7]].tolist() == [0.5, 0.5 - 1, 0.5 - 2, 1.0]
