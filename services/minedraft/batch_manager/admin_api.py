"""Operator-facing endpoints: live speculation policy (what a SpeculationPolicy pushes)."""

from __future__ import annotations

from typing import Literal

from fastapi import APIRouter, FastAPI
from pydantic import BaseModel, ConfigDict, Field

from minedraft.batch_manager.coordinator import Coordinator


class PolicyUpdate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    mode: Literal["psd", "sd", "ar", "auto"] | None = None
    k: int | None = Field(default=None, ge=1, le=16)
    max_num_seqs: int | None = Field(default=None, ge=1)
    pipeline_depth: int | None = Field(default=None, ge=1, le=4)


def install_admin_routes(app: FastAPI, coordinator: Coordinator) -> None:
    router = APIRouter(prefix="/admin")

    @router.get("/policy")
    async def get_policy() -> dict[str, object]:
        return coordinator.config.policy()

    @router.put("/policy")
    async def put_policy(update: PolicyUpdate) -> dict[str, object]:
        return await coordinator.apply_policy(**update.model_dump(exclude_none=True))

    app.include_router(router)
