"""Host time of a step split into named phases, by wrapping the functions that do each part.

A `PhaseClock` keeps a stack of open phases and charges the time between two boundaries to the
innermost one (exclusive time), so the phases of a step add up to its whole host time: what no
wrapped function claims stays with the step's own phase ("other"). A wrapper can also open a
*scope*: phases entered inside it are named with the scope's prefix ("draft: graph replay"),
so a fused step tells its draft's host work from its verify's. `Patches` installs such wrappers on
classes or modules for the length of a `with` block and puts the originals back after it.
"""

from __future__ import annotations

import functools
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

OTHER = "other"


class PhaseClock:
    """Exclusive seconds per phase name, accumulated until `take`."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self.clock = clock
        self.totals: dict[str, float] = defaultdict(float)
        self._stack: list[str] = []
        self._scopes: list[str] = []
        self._mark = 0.0

    def name(self, phase: str) -> str:
        return f"{self._scopes[-1]}: {phase}" if self._scopes else phase

    def enter(self, phase: str, scope: str | None = None) -> None:
        now = self.clock()
        if self._stack:
            self.totals[self._stack[-1]] += now - self._mark
        if scope is not None:
            self._scopes.append(scope)
        self._stack.append(self.name(phase))
        self._mark = now

    def exit(self, scoped: bool = False) -> None:
        now = self.clock()
        self.totals[self._stack.pop()] += now - self._mark
        if scoped:
            self._scopes.pop()
        self._mark = now

    @contextmanager
    def phase(self, phase: str, scope: str | None = None) -> Iterator[None]:
        self.enter(phase, scope)
        try:
            yield
        finally:
            self.exit(scope is not None)

    def wrap(self, fn: Callable[..., Any], phase: str, scope: str | None = None) -> Callable[..., Any]:
        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            with self.phase(phase, scope):
                return fn(*args, **kwargs)

        return timed

    def take(self) -> dict[str, float]:
        """Milliseconds per phase since the last take (the clock's stack must be empty)."""
        assert not self._stack, f"phases still open: {self._stack}"
        out = {name: seconds * 1000.0 for name, seconds in self.totals.items()}
        self.totals.clear()
        return out


@dataclass(frozen=True, slots=True)
class Hook:
    """Wrap `owner.attr` (a class's method or a module's function) as `phase`, optionally opening `scope`."""

    owner: Any
    attr: str
    phase: str
    scope: str | None = None


class Patches:
    """Installs wrappers for a `with` block: each hook's phase around the original, or any wrapper made by
    `extra` (owner, attr, factory of the wrapper from the original)."""

    def __init__(self, clock: PhaseClock, hooks: list[Hook],
                 extra: list[tuple[Any, str, Callable[[Callable[..., Any]], Callable[..., Any]]]] | None = None
                 ) -> None:
        self.clock = clock
        self.hooks = hooks
        self.extra = extra or []
        self._saved: list[tuple[Any, str, Any]] = []  # (owner, attr, its own original; None: inherited)

    def _install(self, owner: Any, attr: str, make: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
        own = vars(owner).get(attr)
        self._saved.append((owner, attr, own))
        setattr(owner, attr, make(getattr(owner, attr)))

    def __enter__(self) -> Patches:
        for hook in self.hooks:
            self._install(hook.owner, hook.attr,
                          lambda fn, h=hook: self.clock.wrap(fn, h.phase, h.scope))
        for owner, attr, make in self.extra:
            self._install(owner, attr, make)
        return self

    def __exit__(self, *exc: object) -> None:
        for owner, attr, original in reversed(self._saved):
            if original is None:
                delattr(owner, attr)  # it was inherited: the base's own stays in force
            else:
                setattr(owner, attr, original)
        self._saved.clear()
