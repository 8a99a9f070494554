"""An executor's hold on its data plane (worker/data_plane.py), and the setup's defaults."""

from __future__ import annotations

from minedraft.worker.data_plane import DataPlane


def setup_timeout_s(setup_timeout: float) -> float:
    """A DataPlaneSetup's timeout, 20 s when the manager left it unset."""
    return setup_timeout or 20.0


class PlaneOwner:
    """An executor's hold on its data plane. Dropping it always closes the process group:
    one left open makes every later epoch in this process fail to form."""

    plane: DataPlane | None = None

    def _drop_plane(self) -> None:
        if self.plane is not None:
            self.plane.close()
            self.plane = None
