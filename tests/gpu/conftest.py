"""GPU-path tests. On a CUDA device every check runs at full size. Without one, the kernel tests
run on the CPU under Triton's interpreter in a quick mode (fewer, smaller cases; triton must be
installed) and the engine tests skip.

The interpreter is chosen by TRITON_INTERPRET=1, which Triton reads when a kernel module is
imported (and again at launch): `kernel_device` sets it for the session and imports the kernel
modules under it, so the tests import the kernels inside the test functions, never at module level.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator

import numpy as np
import pytest
import torch

from tests.gpu.kernel_cases import make_cases
from tests.gpu.kernel_mode import kernel_mode

KERNEL_MODULES = ("minedraft.engine.cuda.paged_attention", "minedraft.engine.cuda.fused_kernels")


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


def _compiled_kernels_loaded() -> bool:
    """True when the kernel module was imported before the interpreter was selected."""
    module = sys.modules.get("minedraft.engine.cuda.paged_attention")
    return module is not None and type(module._paged_attention_kernel).__name__ != "InterpretedFunction"


@pytest.fixture(scope="session")
def kernel_device() -> Iterator[torch.device]:
    """Where the Triton kernels run in this session: cuda, or cpu under the interpreter (whose
    setting stays for the session: Triton reads it again at launch)."""
    mode = kernel_mode()
    if mode.device is None:
        pytest.skip(mode.reason)
    if not mode.interpreted:
        yield torch.device("cuda")
        return
    if _compiled_kernels_loaded():
        pytest.skip("the kernels were imported compiled earlier in this session; run tests/gpu on its own")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("TRITON_INTERPRET", "1")
        for module in KERNEL_MODULES:
            importlib.import_module(module)
        _patch_interpreter_scalar_index()
        yield torch.device("cpu")


@pytest.fixture(scope="session")
def cuda_device() -> torch.device:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    return torch.device("cuda")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """The paged-attention cases: corners plus random ones, as many as the mode runs."""
    if "kernel_case" in metafunc.fixturenames:
        mode = kernel_mode()
        cases = make_cases(mode.random_cases, quick=mode.interpreted or mode.device is None)
        metafunc.parametrize("kernel_case", cases, ids=[c.label() for c in cases])
