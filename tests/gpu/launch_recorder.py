"""Every Triton kernel launch of an interpreter run, recorded as a signature that Triton can compile for a GPU
this machine does not have: a pytest plugin (`-p tests.gpu.launch_recorder`, output file MINEDRAFT_LAUNCHES)
and, run as a module, the compiler of what was recorded for Hopper (sm_90), with each kernel's dependent-chain
switch (`PDL`) and weight prefetch (`PREFETCH`) on, so the chain's code paths are assembled by ptxas as a GPU
would load them.

    python -m tests.gpu.launch_recorder LAUNCHES.json [--representatives] [--off-too] [--resources] [--json OUT]
"""

from __future__ import annotations

import inspect
import json
import os
import sys
from typing import Any

import torch

ENV = "MINEDRAFT_LAUNCHES"
DTYPES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32", torch.int32: "i32",
          torch.int64: "i64", torch.int8: "i8", torch.uint8: "u8", torch.bool: "i1", torch.float8_e4m3fn: "fp8e4nv"}
OPTIONS = ("num_warps", "num_stages")


def describe(arg_names: list[str], constexprs: set[str], args: tuple, kwargs: dict) -> dict[str, Any] | None:
    """A launch as {signature, constexprs, options}; None for argument kinds it does not describe."""
    values = dict(zip(arg_names, args, strict=False)) | {k: v for k, v in kwargs.items() if k in arg_names}
    signature: dict[str, str] = {}
    fixed: dict[str, Any] = {}
    for name in arg_names:
        if name not in values:
            continue  # a defaulted constexpr: the compile takes its default
        value = values[name]
        if name in constexprs:
            signature[name], fixed[name] = "constexpr", value
        elif isinstance(value, torch.Tensor):
            if value.dtype not in DTYPES:
                return None
            signature[name] = "*" + DTYPES[value.dtype]
        elif type(value).__name__ == "TensorDescriptor":  # a tensor-memory-accelerator load's descriptor
            if value.base.dtype not in DTYPES:
                return None
            signature[name] = f"tensordesc<{DTYPES[value.base.dtype]}{list(value.block_shape)}>"
        elif isinstance(value, bool):
            signature[name] = "i1"
        elif isinstance(value, int):
            signature[name] = "i64" if abs(value) >= 2**31 else "i32"
        elif isinstance(value, float):
            signature[name] = "fp32"
        else:
            return None  # an argument kind the step's kernels do not take
    return {"signature": signature, "constexprs": fixed, "options": {k: kwargs[k] for k in OPTIONS if k in kwargs}}


def pytest_configure(config: Any) -> None:
    """Record every launch of this test run's interpreted kernels into MINEDRAFT_LAUNCHES."""
    path = os.environ.get(ENV)
    if not path:
        return
    from triton.runtime.interpreter import InterpretedFunction

    seen: dict[str, dict] = {}
    original = InterpretedFunction.run

    def recording(self: InterpretedFunction, *args: Any, grid: Any, warmup: bool, **kwargs: Any) -> Any:
        fn = self.fn
        params = inspect.signature(fn).parameters
        constexprs = {n for n, p in params.items() if "constexpr" in str(p.annotation)}
        launch = describe(self.arg_names, constexprs, args, kwargs)
        if launch is not None:
            launch |= {"module": fn.__module__, "name": fn.__name__}
            seen.setdefault(json.dumps(launch, sort_keys=True, default=str), launch)
        return original(self, *args, grid=grid, warmup=warmup, **kwargs)

    InterpretedFunction.run = recording  # type: ignore[method-assign]
    config.add_cleanup(lambda: _write(path, list(seen.values())))


def _write(path: str, launches: list[dict]) -> None:
    with open(path, "w") as f:
        json.dump(launches, f, indent=1, default=str)


def variant(launch: dict) -> str:
    """The kernel a launch ran, `+tma` where it loads through tensor descriptors, `+channel` where an FP8 GEMM takes
    one scale per token and weight row (read once, up front, rather than per block)."""
    tma = any(t.startswith("tensordesc") for t in launch["signature"].values())
    channel = launch["constexprs"].get("BLOCK_SCALES") is False
    suffix = ("+tma" if tma else "") + ("+channel" if channel else "")
    return f"{launch['module'].rsplit('.', 1)[-1]}.{launch['name']}{suffix}"


def touches_before_wait(ptx: str) -> int:
    """Global-memory accesses in the code before the chain's first wait (a chained kernel may read only constant
    data there, by prefetch, which this does not count, and write nothing): plain, volatile and atomic loads and
    stores, reductions, asynchronous and tensor-memory-accelerator copies."""
    at = ptx.find("griddepcontrol.wait")
    head = ptx[:at] if at >= 0 else ""
    return sum(head.count(op) for op in ("ld.global", "ld.volatile.global", "st.global", "st.volatile.global",
                                         "atom.global", "red.global", "cp.async"))


def representatives(launches: list[dict]) -> list[dict]:
    """One launch per kernel and load form, a bf16 one where the run had it."""
    chosen: dict[str, dict] = {}
    for launch in launches:
        key = variant(launch)
        bf16 = any(t == "*bf16" for t in launch["signature"].values())
        if key not in chosen or (bf16 and not any(t == "*bf16" for t in chosen[key]["signature"].values())):
            chosen[key] = launch
    return list(chosen.values())


def resources(ptx: str) -> dict[str, int]:
    """Registers per thread and spill bytes of this PTX assembled for sm_90a by Triton's own ptxas (`ptxas -v`)."""
    import re
    import subprocess
    import tempfile

    from triton.backends.nvidia.compiler import get_ptxas

    with tempfile.NamedTemporaryFile("w", suffix=".ptx") as f:
        f.write(ptx)
        f.flush()
        report = subprocess.run([get_ptxas(90).path, "-arch=sm_90a", "-v", f.name, "-o", os.devnull],
                                capture_output=True, text=True, check=True).stderr
    regs = re.search(r"Used (\d+) registers", report)
    spills = re.search(r"(\d+) bytes spill stores", report)
    return {"registers": int(regs.group(1)) if regs else -1, "spill_bytes": int(spills.group(1)) if spills else -1}


def compile_for_hopper(launch: dict, chain: bool = True, with_resources: bool = False) -> dict[str, Any]:
    """Compile one recorded launch for sm_90, its dependent chain (and a GEMM's weight prefetch) on or off; returns
    what the assembled code holds of them."""
    import importlib

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    kernel = getattr(importlib.import_module(launch["module"]), launch["name"])
    constexprs = dict(launch["constexprs"])
    signature = dict(launch["signature"])
    for name, value in (("PDL", chain), ("PREFETCH", int(chain)), ("UPCAST_DOT", False)):
        if name in kernel.arg_names:  # UPCAST_DOT is the interpreter's own
            signature[name], constexprs[name] = "constexpr", value
    compiled = triton.compile(ASTSource(kernel, signature, constexprs=constexprs), target=GPUTarget("cuda", 90, 32),
                              options=launch["options"])
    ptx = compiled.asm["ptx"]
    return {"kernel": variant(launch), "has_pdl": "PDL" in kernel.arg_names,
            "has_prefetch": "PREFETCH" in kernel.arg_names, "chain": chain,
            "waits": "griddepcontrol.wait" in ptx, "launches_dependents": "griddepcontrol.launch_dependents" in ptx,
            "prefetches": ptx.count("prefetch.global.L2"), "touches_before_wait": touches_before_wait(ptx),
            "cubin_bytes": len(compiled.asm["cubin"]),
            "constexprs": constexprs, "options": launch["options"], **(resources(ptx) if with_resources else {})}


def main(argv: list[str]) -> int:
    """LAUNCHES.json [--representatives] [--off-too] [--resources] [--json OUT]: compile every recorded launch (or
    one per kernel) with the chain on (and off), with ptxas's registers and spills; print a line each, exit 1 if
    any fails to compile."""
    with open(argv[0]) as f:
        launches = json.load(f)
    if "--representatives" in argv:
        launches = representatives(launches)
    facts, failed = [], 0
    for launch in launches:
        for chain in (True, False) if "--off-too" in argv else (True,):
            try:
                fact = compile_for_hopper(launch, chain, "--resources" in argv)
                facts.append(fact)
                print(f"ok   {fact['kernel']}: {fact}", flush=True)
            except Exception as exc:  # report every variant, then fail
                failed += 1
                print(f"FAIL {launch['name']} {launch['constexprs']} chain {chain}: {type(exc).__name__}: "
                      f"{str(exc)[:400]}", flush=True)
    if "--json" in argv:
        with open(argv[argv.index("--json") + 1], "w") as f:
            json.dump(facts, f, indent=1)
    print(f"{len(facts)} of {len(facts) + failed} kernel variants compiled for sm_90")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
