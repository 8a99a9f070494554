"""Shared engine: models, paged KV cache, sampling and speculative decoding."""
