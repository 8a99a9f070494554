"""minedraft: batch-parallel speculative decoding for LLM serving."""

__version__ = "0.1.0"
