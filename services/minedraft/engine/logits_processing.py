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
        """The rows of `states`, counted up to their committed tokens."""
        rows, seen_at, seen_ids, count_at, count_ids = [], [], [], [], []
        for st in states:
            row = self.slot.get(st.seq_id)
            if row is None:
                row = self._place(st.seq_id)
            rows.append(row)
            done = self.upto[st.seq_id]
            if done < st.length:
                new = st.tokens[done:]
                seen_at += [row] * len(new)
                seen_ids += new
                output = st.tokens[max(done, st.prompt_len):]
                count_at += [row] * len(output)
                count_ids += output
                self.upto[st.seq_id] = st.length
        if seen_ids:
            at = to_device(torch.tensor(seen_at, dtype=torch.long), self.device)
            self.seen[at, to_device(torch.tensor(seen_ids, dtype=torch.long), self.device)] = True
        if count_ids:
            index = (to_device(torch.tensor(count_at, dtype=torch.long), self.device),
                     to_device(torch.tensor(count_ids, dtype=torch.long), self.device))
            self.counts.index_put_(index, torch.ones(len(count_ids), device=self.device), accumulate=True)
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

    def forget(self, seq_id: int) -> None:
        self.histories.forget(seq_id)
        self.tables.pop(seq_id, None)

    def _tables(self, st: SeqState) -> RowTables:
        if st.seq_id not in self.tables:
            self.tables[st.seq_id] = RowTables(st.params, self.vocab_size, self.device)
        return self.tables[st.seq_id]

    def apply(self, logits: torch.Tensor, states: list[SeqState], drafts: torch.Tensor) -> torch.Tensor:
        """logits [B, k+1, V] of rows `states` with drafts [B, k] -> processed float32 logits (the input itself
        when no row asks for processing)."""
        rows = [b for b, st in enumerate(states) if processes(st.params)]
        if not rows:
            return logits
        if len(rows) == len(states):
            return self._process(logits.float(), states, drafts)
        picked = [states[b] for b in rows]
        index = to_device(torch.tensor(rows, dtype=torch.long), self.device)
        sub = self._process(logits[index].float(), picked, drafts[index])
        out = logits.float().clone()
        out[index] = sub
        return out

    def _process(self, logits: torch.Tensor, states: list[SeqState], drafts: torch.Tensor) -> torch.Tensor:
        _, slots, vocab = logits.shape
        dev = logits.device
        tables = [self._tables(st) for st in states]
        if any(t.allowed is not None for t in tables):
            allowed = _stack([t.allowed for t in tables], torch.ones(vocab, dtype=torch.bool, device=dev))
            logits = logits.masked_fill(~allowed.unsqueeze(1), float("-inf"))
        if any(t.stop is not None for t in tables):
            stop = _stack([t.stop for t in tables], torch.zeros(vocab, dtype=torch.bool, device=dev))
            before = torch.tensor([st.length - st.prompt_len for st in states], dtype=torch.long)
            minimum = torch.tensor([st.params.min_tokens for st in states], dtype=torch.long)
            short = to_device((before.unsqueeze(1) + torch.arange(slots)) < minimum.unsqueeze(1), dev)  # [R, T]
            logits = logits.masked_fill(short.unsqueeze(-1) & stop.unsqueeze(1), float("-inf"))
        if any(t.bias is not None for t in tables):
            logits = logits + _stack([t.bias for t in tables], torch.zeros(vocab, device=dev)).unsqueeze(1)
        if any(st.params.penalised for st in states):
            logits = self._penalise(logits, states, drafts)
        return logits

    def _penalise(self, logits: torch.Tensor, states: list[SeqState], drafts: torch.Tensor) -> torch.Tensor:
        """Counts at slot i are the committed output's plus drafts[:i]'s."""
        rows, slots, vocab = logits.shape
        dev = logits.device
        at = self.histories.rows(states)
        counts = self.histories.counts[at].unsqueeze(1).expand(rows, slots, vocab)
        seen = self.histories.seen[at].unsqueeze(1)
        if slots > 1:
            drafted = torch.zeros((rows, slots, vocab), dtype=torch.float32, device=dev)
            drafted[:, 1:].scatter_(-1, drafts.to(dev).long().unsqueeze(-1), 1.0)
            drafted = drafted.cumsum(dim=1)
            counts = counts + drafted
            seen = seen | (drafted > 0)

        def column(name: str) -> torch.Tensor:
            values = torch.tensor([getattr(st.params, name) for st in states], dtype=torch.float32)
            return to_device(values, dev).view(-1, 1, 1)

        repetition = column("repetition_penalty")
        penalised = torch.where(logits > 0, logits / repetition, logits * repetition)
        logits = torch.where(seen & (repetition != 1.0), penalised, logits)
        logits = logits - column("frequency_penalty") * counts
        return logits - column("presence_penalty") * (counts > 0).float()
