"""Draft service: the draft model and its own KV cache, on its own device."""
