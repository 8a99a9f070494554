"""What a request asks done to the target's logits before sampling: masks, biases and penalties.

Slot i of a verify row scores the token after the committed tokens and the row's first i drafts. A plain
decode that had emitted those drafts would have seen exactly that history, so processing each slot with it
keeps the acceptance rule exact: the distribution at every slot is the one plain decoding would sample
from, and a rejection discards every later slot (vLLM's argument, vllm#6718). The order, as in
`SamplingParams`: allowed_token_ids masks all other tokens; min_tokens masks the stop ids while the output
before the slot is shorter than min_tokens; logit_bias is added; repetition_penalty divides positive and
multiplies negative logits of every token seen in prompt or output; frequency_penalty x count and
presence_penalty x [count > 0] of the output's tokens are subtracted. Temperature, min_p, top-k and top-p
follow in `sampling.processed_probs`. Rows that ask for none of it cost nothing: a batch without such rows
returns its logits untouched.
"""

from __future__ import annotations

import torch

from minedraft.core.sampling_params import SamplingParams
from minedraft.engine.sequence import SeqState
from minedraft.engine.transfer import to_device


def processes(params: SamplingParams) -> bool:
    """Whether this module changes the row's logits (min_p is applied with temperature, in sampling.py)."""
    return bool(params.penalised or params.logit_bias or params.min_tokens or params.allowed_token_ids)


class TokenHistories:
    """Every penalised sequence's output-token counts and the set of tokens seen in prompt or output: one row
    each of two device tables, brought up to date from the committed tokens in one batched update per step
    (a per-sequence update would cost a few kernel launches per row and step)."""

    def __init__(self, vocab_size: int, device: torch.device) -> None:
        self.vocab_size = vocab_size
        self.device = device
        self.counts = torch.zeros((0, vocab_size), dtype=torch.float32, device=device)
        self.seen = torch.zeros((0, vocab_size), dtype=torch.bool, device=device)
        self.slot: dict[int, int] = {}  # sequence id -> its row
        self.upto: dict[int, int] = {}  # sequence id -> tokens already counted
        self.free: list[int] = []

    def forget(self, seq_id: int) -> None:
        if seq_id in self.slot:
            self.free.append(self.slot.pop(seq_id))
            self.upto.pop(seq_id)

    def _place(self, seq_id: int) -> int:
        if not self.free:
            grow = max(8, self.counts.shape[0])
            self.free = list(range(self.counts.shape[0] + grow - 1, self.counts.shape[0] - 1, -1))
            pad = (grow, self.vocab_size)
            self.counts = torch.cat((self.counts, torch.zeros(pad, dtype=torch.float32, device=self.device)))
            self.seen = torch.cat((self.seen, torch.zeros(pad, dtype=torch.bool, device=self.device)))
        row = self.free.pop()
        self.counts[row].zero_()
        self.seen[row].zero_()
        self.slot[seq_id], self.upto[seq_id] = row, 0
        return row

    def rows(self, states: list[SeqState]) -> torch.Tensor:
        """The rows of `states`, counted up to their committed tokens.

        The tables are updated through flat indices (row x vocabulary + token): `index_put_` with
        accumulation checks its indices' range on the host, which waits for the GPU, and a step launched
        ahead must not wait (verifier/ar_ahead.py, launch_ahead.py); `scatter_add_` and `index_fill_` check
        theirs on the device. The counts are whole numbers, so the atomic adds' order does not change them."""
        rows, seen, counted = [], [], []
        vocab = self.vocab_size
        for st in states:
            row = self.slot.get(st.seq_id)
            if row is None:
                row = self._place(st.seq_id)
            rows.append(row)
            done = self.upto[st.seq_id]
            if done < st.length:
                seen += [row * vocab + t for t in st.tokens[done:]]
                counted += [row * vocab + t for t in st.tokens[max(done, st.prompt_len):]]
                self.upto[st.seq_id] = st.length
        if seen:
            self.seen.view(-1).index_fill_(0, to_device(torch.tensor(seen, dtype=torch.long), self.device), True)
        if counted:
            at = to_device(torch.tensor(counted, dtype=torch.long), self.device)
            self.counts.view(-1).scatter_add_(0, at, torch.ones(len(counted), device=self.device))
        return to_device(torch.tensor(rows, dtype=torch.long), self.device)


class RowTables:
    """A sequence's constant masks and biases as dense vocabulary rows (built once, on first use)."""

    def __init__(self, params: SamplingParams, vocab_size: int, device: torch.device) -> None:
        self.bias: torch.Tensor | None = None
        self.allowed: torch.Tensor | None = None
        self.stop: torch.Tensor | None = None
        if params.logit_bias:
            bias = torch.zeros(vocab_size, dtype=torch.float32)
            bias[torch.tensor(list(params.logit_bias), dtype=torch.long)] = torch.tensor(
                list(params.logit_bias.values()), dtype=torch.float32)
            self.bias = to_device(bias, device)
        if params.allowed_token_ids:
            allowed = torch.zeros(vocab_size, dtype=torch.bool)
            allowed[torch.tensor(params.allowed_token_ids, dtype=torch.long)] = True
            self.allowed = to_device(allowed, device)
        if params.min_tokens and params.stop_token_ids:
            stop = torch.zeros(vocab_size, dtype=torch.bool)
            stop[torch.tensor(params.stop_token_ids, dtype=torch.long)] = True
            self.stop = to_device(stop, device)


def _stack(rows: list[torch.Tensor | None], fill: torch.Tensor) -> torch.Tensor:
    return torch.stack([fill if r is None else r for r in rows])


class LogitsProcessing:
    """The per-sequence state processing needs, and the step that applies it to a batch's logits."""

    def __init__(self, vocab_size: int, device: torch.device) -> None:
        self.vocab_size = vocab_size
        self.device = device
        self.histories = TokenHistories(vocab_size, device)
        self.tables: dict[int, RowTables] = {}
        self.pairs: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}  # per (slots, lead)

    def forget(self, seq_id: int) -> None:
        self.histories.forget(seq_id)
        self.tables.pop(seq_id, None)

    def _tables(self, st: SeqState) -> RowTables:
        if st.seq_id not in self.tables:
            self.tables[st.seq_id] = RowTables(st.params, self.vocab_size, self.device)
        return self.tables[st.seq_id]

    def apply(self, logits: torch.Tensor, states: list[SeqState], drafts: torch.Tensor,
              pending: torch.Tensor | None = None) -> torch.Tensor:
        """logits [B, k+1, V] of rows `states` with drafts [B, k] -> processed float32 logits (the input itself
        when no row asks for processing). `pending` [B, 1]: each row's token of a step not committed yet (an AR
        step launched ahead of that commit decodes after it), output history before slot 0."""
        rows = [b for b, st in enumerate(states) if processes(st.params)]
        if not rows:
            return logits
        lead = 0
        if pending is not None:
            drafts, lead = torch.cat((pending.to(drafts.device), drafts), dim=1), pending.shape[1]
        if len(rows) == len(states):
            return self._process(logits.float(), states, drafts, lead)
        picked = [states[b] for b in rows]
        index = to_device(torch.tensor(rows, dtype=torch.long), self.device)
        sub = self._process(logits[index].float(), picked, drafts[index], lead)
        out = logits.float().clone()
        out[index] = sub
        return out

    def _process(self, logits: torch.Tensor, states: list[SeqState], drafts: torch.Tensor, lead: int = 0
                 ) -> torch.Tensor:
        """Slot i's history is the committed tokens plus drafts[:, :lead + i]."""
        _, slots, vocab = logits.shape
        dev = logits.device
        tables = [self._tables(st) for st in states]
        if any(t.allowed is not None for t in tables):
            allowed = _stack([t.allowed for t in tables], torch.ones(vocab, dtype=torch.bool, device=dev))
            logits = logits.masked_fill(~allowed.unsqueeze(1), float("-inf"))
        if any(t.stop is not None for t in tables):
            stop = _stack([t.stop for t in tables], torch.zeros(vocab, dtype=torch.bool, device=dev))
            before = torch.tensor([st.length - st.prompt_len + lead for st in states], dtype=torch.long)
            minimum = torch.tensor([st.params.min_tokens for st in states], dtype=torch.long)
            short = to_device((before.unsqueeze(1) + torch.arange(slots)) < minimum.unsqueeze(1), dev)  # [R, T]
            logits = logits.masked_fill(short.unsqueeze(-1) & stop.unsqueeze(1), float("-inf"))
        if any(t.bias is not None for t in tables):
            logits = logits + _stack([t.bias for t in tables], torch.zeros(vocab, device=dev)).unsqueeze(1)
        if any(st.params.penalised for st in states):
            logits = self._penalise(logits, states, drafts, lead=lead)
        return logits

    def _pairs(self, slots: int, lead: int, dev: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The (slot i, draft j < lead + i) pairs of `slots` slots, whose token drafts[:, j] has drafts[:, :lead + i]'s
        occurrences added at slot i, and which drafts come before each pair's slot ([P, drafts]); made once."""
        if (slots, lead) not in self.pairs:
            slot_of, draft_of = (torch.tensor(v, dtype=torch.long) for v in
                                 zip(*((i, j) for i in range(slots) for j in range(lead + i)), strict=True))
            before = torch.arange(lead + slots - 1).unsqueeze(0) < (slot_of + lead).unsqueeze(1)
            self.pairs[slots, lead] = (to_device(slot_of, dev), to_device(draft_of, dev), to_device(before, dev))
        return self.pairs[slots, lead]

    def _penalise(self, logits: torch.Tensor, states: list[SeqState], drafts: torch.Tensor, lead: int = 0
                  ) -> torch.Tensor:
        """Counts at slot i are the committed output's plus drafts[:lead + i]'s. Every slot is penalised with the
        committed history in one pass (per-token factors and offsets built once per row, [rows, vocab]); then
        the few entries a slot's earlier drafts touch (at most i per slot) are recomputed with their counts,
        by the same formula, so a slot's values are those a plain decode of that history computes."""
        rows, slots, vocab = logits.shape
        dev = logits.device
        at = self.histories.rows(states)
        counts, seen = self.histories.counts[at], self.histories.seen[at]  # [R, V]
        values = torch.tensor([[st.params.repetition_penalty, st.params.frequency_penalty,
                                st.params.presence_penalty] for st in states], dtype=torch.float32)
        repetition, frequency, presence = to_device(values, dev).unbind(1)  # [R] each, one upload
        factor = torch.where(seen, repetition.unsqueeze(1), 1.0)  # x / 1 and x * 1 are x: unseen tokens keep theirs
        out = _penalised(logits, factor.unsqueeze(1), _offset(counts, frequency.unsqueeze(1),
                                                                presence.unsqueeze(1)).unsqueeze(1))
        if lead + slots < 2:
            return out
        slot_of, draft_of, before = self._pairs(slots, lead, dev)
        drafts = drafts.to(dev).long()
        token = drafts[:, draft_of]  # [R, P]
        extra = ((drafts.unsqueeze(1) == token.unsqueeze(2)) & before).sum(dim=2)  # [R, P]
        count = counts.gather(1, token) + extra.float()
        at_slot = slot_of * vocab + token  # [R, P] into [R, T * V]
        flat = out.view(rows, slots * vocab)
        x = logits.reshape(rows, slots * vocab).gather(1, at_slot)
        fixed = _penalised(x, repetition.unsqueeze(1),
                           _offset(count, frequency.unsqueeze(1), presence.unsqueeze(1)))
        flat.scatter_(1, at_slot, fixed)  # a token drafted twice is written twice with one value
        return out


def _offset(counts: torch.Tensor, frequency: torch.Tensor, presence: torch.Tensor) -> torch.Tensor:
    """What frequency and presence penalties subtract for a token seen `counts` times in the output."""
    return (frequency * counts).add_(presence * (counts > 0))


def _penalised(x: torch.Tensor, factor: torch.Tensor, offset: torch.Tensor) -> torch.Tensor:
    """Repetition (`factor` divides positive, multiplies negative logits; 1 where the token was not seen),
    then the frequency and presence offset."""
    return torch.where(x > 0, x / factor, x * factor).sub_(offset)
