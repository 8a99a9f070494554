"""The EAGLE head's stash: the target's committed states per sequence, kept until a proposal feeds them.

In steady state a sequence's live span is short: a verdict brings at most k+1 committed states and the
next proposal feeds them, keeping only the newest for a re-feed. So a span lives in a slot of one device
window buffer [slots * window + 1, F] in the head's dtype, position p at row slot * window + p % window;
the last row stays zero, and is what a position without a state reads. A batch's commits reach the
device together (one index_copy at the next read, however many sequences committed), and a proposal's
features are one index_select over the buffer. A span longer than the window (a prompt's prefill states,
or verdicts piling up between proposals) is kept as its own tensor until a proposal retires it into the
window again. A window of 0 keeps every span as its own tensor: one sequence at a time.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from minedraft.engine.transfer import to_device


@dataclass(slots=True)
class PendingWrite:
    seq_id: int
    rows: torch.Tensor  # [n, F] the states, as they came
    dest: list[int]  # the buffer row of each (zeros where rows is empty)


class EagleStash:
    def __init__(self, feature_width: int, dtype: torch.dtype, device: torch.device, window: int = 16,
                 slots: int = 8) -> None:
        self.feature_width, self.dtype, self.device, self.window = feature_width, dtype, device, window
        self.spans: dict[int, tuple[int, int]] = {}  # first position, end: the states of first..end-1
        self.slot_of: dict[int, int] = {}  # sequences whose span is in the window buffer
        self.long: dict[int, torch.Tensor] = {}  # the others: their states [end - first, F]
        self.free: list[int] = []
        self.slots = 0
        self.buffer = torch.zeros((1, feature_width), dtype=dtype, device=device)
        self.pending: list[PendingWrite] = []
        self._grow(slots if window > 0 else 0)

    def span(self, seq_id: int) -> tuple[int, int] | None:
        return self.spans.get(seq_id)

    def drop(self, seq_id: int) -> None:
        self.spans.pop(seq_id, None)
        self.long.pop(seq_id, None)
        if seq_id in self.slot_of:
            self.free.append(self.slot_of.pop(seq_id))
            self.pending = [w for w in self.pending if w.seq_id != seq_id]

    def put(self, seq_id: int, first: int, start: int, rows: torch.Tensor) -> None:
        """Keep the states `rows` of positions start.. after the span (from `first` if it has none); a gap
        before `start` (states the target never computed) becomes zeros for good."""
        if seq_id not in self.spans:
            self.spans[seq_id] = (first, first)
            if self.window > 0:
                self.slot_of[seq_id] = self._take_slot()
            else:
                self.long[seq_id] = self.buffer[:0]
        first, end = self.spans[seq_id]
        skip = max(0, end - start)
        if start + rows.shape[0] <= end:  # nothing new
            return
        new_end = start + rows.shape[0]
        if seq_id in self.slot_of and new_end - first > self.window:
            self._to_long(seq_id)
        if seq_id in self.long:
            parts = [self.long[seq_id]]
            if start > end:
                parts.append(torch.zeros((start - end, self.feature_width), dtype=self.dtype, device=self.device))
            parts.append(rows[skip:].to(self.device, self.dtype))
            self.long[seq_id] = torch.cat(parts)
        else:
            slot = self.slot_of[seq_id]
            if start > end:
                self.pending.append(PendingWrite(seq_id, rows[:0], self._rows(slot, end, start)))
            self.pending.append(PendingWrite(seq_id, rows[skip:], self._rows(slot, start + skip, new_end)))
        self.spans[seq_id] = (first, new_end)

    def retire(self, seq_id: int, keep_from: int) -> None:
        """Drop the states before `keep_from` (fed for good); a long span that now fits goes to the window."""
        if seq_id not in self.spans:
            return
        first, end = self.spans[seq_id]
        drop = min(max(0, keep_from - first), end - first)
        self.spans[seq_id] = (first + drop, end)
        if seq_id in self.long:
            self.long[seq_id] = self.long[seq_id][drop:]
            if self.window > 0 and end - first - drop <= self.window:
                slot = self._take_slot()
                self.slot_of[seq_id] = slot
                self.pending.append(PendingWrite(seq_id, self.long.pop(seq_id), self._rows(slot, first + drop, end)))

    def gather(self, seq_ids: list[int], starts: list[int], counts: list[int], width: int) -> torch.Tensor:
        """Features [B, width, F]: row b's states of positions starts[b] .. starts[b] + counts[b] - 1 (in
        its span), zeros after them."""
        self.flush()
        zero = self.buffer.shape[0] - 1
        index = [zero] * (len(seq_ids) * width)
        longs = []
        for b, (seq_id, start, n) in enumerate(zip(seq_ids, starts, counts, strict=True)):
            if n and seq_id in self.slot_of:
                index[b * width:b * width + n] = self._rows(self.slot_of[seq_id], start, start + n)
            elif n:
                longs.append((b, seq_id, start, n))
        flat = to_device(torch.tensor(index, dtype=torch.long), self.device)
        features = self.buffer.index_select(0, flat).view(len(seq_ids), width, self.feature_width)
        for b, seq_id, start, n in longs:
            first = self.spans[seq_id][0]
            features[b, :n] = self.long[seq_id][start - first:start - first + n]
        return features

    def flush(self) -> None:
        """The pending writes, in one copy (the positions of a batch's writes are distinct: spans only grow
        between reads, and never past the window)."""
        if not self.pending:
            return
        writes, self.pending = self.pending, []
        dest = to_device(torch.tensor([d for w in writes for d in w.dest], dtype=torch.long), self.device)
        like = writes[0].rows  # the batch's states, as they came: one conversion for all of them
        parts = [w.rows.to(like.device, like.dtype) if w.rows.shape[0] else
                 torch.zeros((len(w.dest), self.feature_width), dtype=like.dtype, device=like.device) for w in writes]
        rows = torch.cat(parts) if len(parts) > 1 else parts[0]
        self.buffer.index_copy_(0, dest, rows.to(self.device, self.dtype))

    def _to_long(self, seq_id: int) -> None:
        """A span outgrowing the window: its states leave the buffer for a tensor of their own."""
        first, end = self.spans[seq_id]
        slot = self.slot_of.pop(seq_id)
        self.long[seq_id] = self.buffer[:0]
        if end > first:
            if any(w.seq_id == seq_id for w in self.pending):
                self.flush()
            index = to_device(torch.tensor(self._rows(slot, first, end), dtype=torch.long), self.device)
            self.long[seq_id] = self.buffer.index_select(0, index)
        self.free.append(slot)

    def _rows(self, slot: int, start: int, end: int) -> list[int]:
        return [slot * self.window + p % self.window for p in range(start, end)]

    def _take_slot(self) -> int:
        if not self.free:
            self._grow(max(self.slots, 8))
        return self.free.pop()

    def _grow(self, more: int) -> None:
        """More slots: the buffer's rows keep their places (a row's place is slot * window + p % window)."""
        if more <= 0:
            return
        used = self.slots * self.window
        with torch.inference_mode(False):  # a plain tensor: written in place from outside inference mode too
            grown = torch.zeros(((self.slots + more) * self.window + 1, self.feature_width), dtype=self.dtype,
                                device=self.device)
        grown[:used] = self.buffer[:used]
        self.buffer = grown
        self.free.extend(range(self.slots + more - 1, self.slots - 1, -1))
        self.slots += more
