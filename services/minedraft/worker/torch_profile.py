"""On-demand torch.profiler windows over a worker's steps (where a step's GPU and host time goes).

Off unless MINEDRAFT_TORCH_PROFILE_DIR is set. A window is asked for by writing a file
`<dir>/<role>.request` holding a label and a step count ("psd 30"); the worker's loop sees it
before its next step, profiles that many steps (CPU ops, CUDA runtime calls, GPU kernels, and the
step phases that `step_timing.timed` names), then writes `<dir>/<role>-<label>.trace.json`
(Chrome trace format, readable by Perfetto and by `bench.gpu.trace_summary`) and removes nothing
else. The request file is consumed when the window starts, so a benchmark can ask again.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import torch

from minedraft.worker import step_timing

log = logging.getLogger(__name__)
DIR_ENV = "MINEDRAFT_TORCH_PROFILE_DIR"


def role_file_name(role: str) -> str:
    """Roles like "verifier+draft" become safe file names."""
    return role.replace("+", "_")


class StepProfiler:
    """One profiling window at a time, driven by request files."""

    def __init__(self, folder: Path, role: str, device: torch.device) -> None:
        self.folder = folder
        self.name = role_file_name(role)
        self.device = device
        self.request = folder / f"{self.name}.request"
        self.profile: torch.profiler.profile | None = None
        self.label = ""
        self.steps_left = 0
        self.step_scope: torch.profiler.record_function | None = None

    @classmethod
    def from_env(cls, role: str, device: torch.device) -> StepProfiler | None:
        folder = os.environ.get(DIR_ENV)
        if not folder:
            return None
        path = Path(folder)
        path.mkdir(parents=True, exist_ok=True)
        return cls(path, role, device)

    def before_step(self, step: int) -> None:
        if self.profile is None and self.request.exists():
            self._start()
        if self.profile is not None:
            self.step_scope = torch.profiler.record_function(f"step {step}")
            self.step_scope.__enter__()

    def after_step(self) -> None:
        if self.profile is None:
            return
        if self.step_scope is not None:
            self.step_scope.__exit__(None, None, None)
            self.step_scope = None
        self.steps_left -= 1
        if self.steps_left <= 0:
            self._finish()

    def _start(self) -> None:
        words = self.request.read_text().split()
        self.request.unlink(missing_ok=True)
        self.label = words[0] if words else "window"
        self.steps_left = int(words[1]) if len(words) > 1 else 20
        activities = [torch.profiler.ProfilerActivity.CPU]
        if self.device.type == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        self.profile = torch.profiler.profile(activities=activities)
        self.profile.__enter__()
        step_timing.set_annotations(True)

    def _finish(self) -> None:
        assert self.profile is not None
        step_timing.set_annotations(False)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.profile.__exit__(None, None, None)
        target = self.folder / f"{self.name}-{self.label}.trace.json"
        self.profile.export_chrome_trace(str(target))
        log.info("profile of %s written to %s", self.label, target)
        self.profile = None
