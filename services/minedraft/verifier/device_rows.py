"""Which rows a verify (or an AR step) may run without the host between steps: the rules launch-ahead
(launch_ahead.py, ar_ahead.py) and verifies taking their drafts unread (posted_drafts.py) share."""

from __future__ import annotations

from minedraft.core.sampling_params import SamplingParams
from minedraft.engine.verifier import Verifier


def host_free(params: SamplingParams) -> bool:
    """Nothing between steps needs the host: no grammar to advance (a row's logprobs are computed on the
    device with its step and read back with the verdict)."""
    return params.structured is None


def device_rows(worker: Verifier, ids: list[int], sampled: bool = True) -> bool:
    """Whether a verify of `ids` can take its drafts as device tokens, unread: every row is held, in the steady
    state (one committed token not yet in the KV) and host-free; greedy too unless `sampled`
    (the draft probabilities of a batch with a sampled row are received into the device as well)."""
    for seq_id in ids:
        st = worker.seqs.get(seq_id)
        if st is None or st.length - st.cached != 1 or not host_free(st.params):
            return False
        if not sampled and not st.params.greedy:
            return False
    return True


def samples(worker: Verifier, ids: list[int]) -> bool:
    """Whether a row of the batch samples: then the draft service sends the drafts' probabilities after the
    frame (engine/sampling.sample_tokens gives them for any batch that is not all greedy)."""
    return not all(worker.seqs[s].params.greedy for s in ids)
