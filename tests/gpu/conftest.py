"""GPU-path tests: the Triton interpreter needs one shim to run our kernels on the CPU."""

from __future__ import annotations

import os

import numpy as np
import pytest


def _patch_interpreter_scalar_index() -> None:
    """Interpreter-only shim (TRITON_INTERPRET=1): runtime loop bounds under numpy >= 2.4.

    Triton 3.6's interpreter keeps scalars loaded from memory as shape-(1,) arrays and turns
    a `range(lo, hi)` bound into a Python int with `int(array)`, which numpy 2.4 rejects
    ("only 0-dimensional arrays can be converted to Python scalars"). Compiled kernels are
    unaffected; this only re-defines `tensor.__index__` inside the interpreter's patch scope.
    It lives here, not in the kernel module, so importing the product never patches a library.
    """
    try:
        from triton.runtime import interpreter
    except ImportError:
        return
    original = getattr(interpreter, "_patch_lang_tensor", None)
    if original is None or getattr(original, "_minedraft_shim", False):
        return

    def patched(tensor, scope):  # type: ignore[no-untyped-def]
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(np.asarray(self.handle.data).reshape(-1)[0]))

    patched._minedraft_shim = True  # type: ignore[attr-defined]
    interpreter._patch_lang_tensor = patched


@pytest.fixture(autouse=True, scope="session")
def triton_interpreter_shim() -> None:
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        _patch_interpreter_scalar_index()
