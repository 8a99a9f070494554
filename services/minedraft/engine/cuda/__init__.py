"""GPU-only code paths: Triton kernels that replace the plain-torch reference ops.

Nothing here is needed on CPU. Importing this package never fails: when Triton is not
installed `HAS_TRITON` is False and the kernel entry points are None, so callers can
pick the reference path (`minedraft.engine.attention`) instead.
"""

from __future__ import annotations

try:
    from minedraft.engine.cuda.paged_attention import paged_attention_triton, write_kv_triton
except ImportError:  # no triton on this machine
    HAS_TRITON = False
    paged_attention_triton = None
    write_kv_triton = None
else:
    HAS_TRITON = True

__all__ = ["HAS_TRITON", "paged_attention_triton", "write_kv_triton"]
