"""GPU-path tests. On a CUDA device every check runs at full size. Without one, the kernel tests
run on the CPU under Triton's interpreter in a quick mode (fewer, smaller cases; triton must be
installed) and the engine tests skip.

The interpreter is chosen by TRITON_INTERPRET=1, which Triton reads when triton.language and each
kernel module are imported (and again at launch): in that mode `pytest_configure` sets it for the
session, before any test runs, and the tests import the kernels inside the test functions.
"""

from __future__ import annotations

import importlib
import os
import sys

import numpy as np
import pytest
import torch

from tests.gpu.kernel_cases import make_cases
from tests.gpu.kernel_mode import kernel_mode

KERNEL_MODULES = ("minedraft.engine.cuda.paged_attention", "minedraft.engine.cuda.fused_kernels",
                  "minedraft.engine.cuda.greedy_verdict", "minedraft.engine.cuda.skinny_gemm",
                  "minedraft.engine.cuda.skinny_rope")


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


SAVED_INTERPRET = pytest.StashKey[str | None]()


def pytest_configure(config: pytest.Config) -> None:
    """In the interpreter mode, select it before any test runs: Triton reads TRITON_INTERPRET when
    triton.language and each kernel module are imported (other tests may import triton first)."""
    mode = kernel_mode()
    if mode.device == "cpu" and mode.interpreted:
        config.stash[SAVED_INTERPRET] = os.environ.get("TRITON_INTERPRET")
        os.environ["TRITON_INTERPRET"] = "1"


def pytest_unconfigure(config: pytest.Config) -> None:
    if SAVED_INTERPRET in config.stash:
        saved = config.stash[SAVED_INTERPRET]
        if saved is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = saved


def _imported_compiled() -> bool:
    """True when triton.language or a kernel module was imported before the interpreter was selected."""
    modules = [sys.modules.get(name) for name in ("triton.language", *KERNEL_MODULES)]
    kernels = [modules[0].standard.sum if modules[0] else None,
               getattr(modules[1], "_paged_attention_kernel", None), getattr(modules[2], "_add_rms_norm_kernel", None)]
    return any(k is not None and type(k).__name__ != "InterpretedFunction" for k in kernels)


@pytest.fixture(scope="session")
def kernel_device() -> torch.device:
    """Where the Triton kernels run in this session: cuda, or cpu under the interpreter."""
    mode = kernel_mode()
    if mode.device is None:
        pytest.skip(mode.reason)
    if not mode.interpreted:
        return torch.device("cuda")
    if _imported_compiled():
        pytest.skip("triton was imported before the interpreter was selected; run `pytest tests/gpu` on its own")
    for module in KERNEL_MODULES:
        importlib.import_module(module)
    _patch_interpreter_scalar_index()
    return torch.device("cpu")


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
