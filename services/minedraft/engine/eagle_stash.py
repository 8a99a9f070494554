"""The EAGLE head's stash: the target's committed states per sequence, kept until a proposal feeds them.

In steady state a sequence's live span is short: a verdict brings at most k+1 committed states and the
next proposal feeds them, keeping only the newest for a re-feed. So a span lives in a slot of one device
window buffer [slots * window + 1, F] in the head's dtype, position p at row slot * window + p % window;
the last row stays zero, and is what a position without a state reads. A batch's commits reach the
device together (one index_copy at the next read, however many sequences committed), and a proposal's
features are one index_select over the buffer, into the static buffer the head's first-forward CUDA graph
reads when one replays it; the rows of both travel in one upload, computed with numpy over the batch. A
span longer than the window (a prompt's prefill states, or verdicts piling up between proposals) is kept
as its own tensor until a proposal retires it into the window again. A window of 0 keeps every span as
its own tensor: one sequence at a time.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from minedraft.engine.transfer import to_device


@dataclass(slots=True)
class PendingWrite:
    seq_id: int
    rows: torch.Tensor  # [end - start, F] the states, as they came (or none: zeros)
    slot: int
    start: int  # the positions start..end-1 of the slot
    end: int


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
                self.pending.append(PendingWrite(seq_id, rows[:0], slot, end, start))
            self.pending.append(PendingWrite(seq_id, rows[skip:], slot, start + skip, new_end))
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
                self.pending.append(PendingWrite(seq_id, self.long.pop(seq_id), slot, first + drop, end))

    def gather(self, seq_ids: list[int], starts: list[int], counts: list[int], width: int,
               out: torch.Tensor | None = None) -> torch.Tensor:
        """Features [B, width, F]: row b's states of positions starts[b] .. starts[b] + counts[b] - 1 (in
        its span), zeros after them; written into `out` ([B, width, F], contiguous) when given. The pending
        writes land first, their rows and the read's in one upload."""
        batch, zero, window = len(seq_ids), self.buffer.shape[0] - 1, max(self.window, 1)
        slot = np.array([self.slot_of.get(seq_id, -1) for seq_id in seq_ids], dtype=np.int64)
        n = np.where(slot >= 0, np.asarray(counts, dtype=np.int64), 0)
        offsets = np.arange(width)
        rows = slot[:, None] * window + (np.asarray(starts, dtype=np.int64)[:, None] + offsets) % window
        index = np.where(offsets < n[:, None], rows, zero).reshape(-1)
        dest, states = self._take_pending()
        flat = to_device(torch.from_numpy(np.concatenate((dest, index))), self.device)
        if states is not None:
            self.buffer.index_copy_(0, flat[: dest.shape[0]], states)
        if out is None:
            features = self.buffer.index_select(0, flat[dest.shape[0]:]).view(batch, width, self.feature_width)
        else:
            torch.index_select(self.buffer, 0, flat[dest.shape[0]:], out=out.view(batch * width, self.feature_width))
            features = out
        for b, seq_id in enumerate(seq_ids):
            if counts[b] and slot[b] < 0:  # a long span: its own tensor
                start, first = starts[b], self.spans[seq_id][0]
                features[b, : counts[b]] = self.long[seq_id][start - first : start - first + counts[b]]
        return features

    def flush(self) -> None:
        """The pending writes, in one copy (the positions of a batch's writes are distinct: spans only grow
        between reads, and never past the window)."""
        dest, states = self._take_pending()
        if states is not None:
            self.buffer.index_copy_(0, to_device(torch.from_numpy(dest), self.device), states)

    def _take_pending(self) -> tuple[np.ndarray, torch.Tensor | None]:
        """The pending writes' buffer rows and their states, converted together (None: nothing pending)."""
        if not self.pending:
            return np.empty(0, dtype=np.int64), None
        writes, self.pending = self.pending, []
        like = writes[0].rows  # the batch's states, as they came: one conversion for all of them
        parts = [w.rows.to(like.device, like.dtype) if w.rows.shape[0] else
                 torch.zeros((w.end - w.start, self.feature_width), dtype=like.dtype, device=like.device)
                 for w in writes]
        rows = torch.cat(parts) if len(parts) > 1 else parts[0]
        table = np.array([(w.slot, w.start, w.end) for w in writes], dtype=np.int64)
        slot, start, counts = table[:, 0], table[:, 1], table[:, 2] - table[:, 1]
        shift = np.repeat(np.cumsum(counts) - counts - start, counts)  # row i of them is position i - shift[i]
        dest = np.repeat(slot * self.window, counts) + (np.arange(counts.sum()) - shift) % self.window
        return dest, rows.to(self.device, self.dtype)

    def _to_long(self, seq_id: int) -> None:
        """A span outgrowing the window: its states leave the buffer for a tensor of their own."""
        first, end = self.spans[seq_id]
        slot = self.slot_of.pop(seq_id)
        self.long[seq_id] = self.buffer[:0]
        if end > first:
            if any(w.seq_id == seq_id for w in self.pending):
                self.flush()
            index = to_device(torch.from_numpy(self._rows(slot, first, end)), self.device)
            self.long[seq_id] = self.buffer.index_select(0, index)
        self.free.append(slot)

    def _rows(self, slot: int, start: int, end: int) -> np.ndarray:
        return slot * self.window + np.arange(start, end, dtype=np.int64) % self.window

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
