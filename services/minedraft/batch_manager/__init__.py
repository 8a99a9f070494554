"""Batch manager: public APIs, request life cycle, the two batches and the step driver."""
