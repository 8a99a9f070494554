"""Operator-facing endpoints: the live speculation policy (what a SpeculationPolicy pushes).

`PUT /admin/policy` takes any subset of the policy fields and answers with the whole
effective policy, like `GET /admin/policy`. An unknown field is 422; a value of the wrong
type, out of bounds or not finite is 400, with a message naming the field. The request model
is built from `policy.POLICY_FIELDS`, so the API cannot drift from what the step loop accepts.
These routes live on the admin listener only (MINEDRAFT_ADMIN_HOST:MINEDRAFT_ADMIN_PORT,
loopback by default), never on the public port, behind their own key (MINEDRAFT_ADMIN_API_KEY).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model

from minedraft import __version__
from minedraft.batch_manager.api_keys import ApiKeys
from minedraft.batch_manager.coordinator import Coordinator
from minedraft.batch_manager.http_api import error_response, install_health_route
from minedraft.batch_manager.http_guards import ApiKeyGuard, BodyLimit
from minedraft.batch_manager.policy import POLICY_FIELDS, PolicyField
from minedraft.core.errors import InvalidRequestError

ADMIN_MAX_BODY_BYTES = 64 * 1024  # a policy is a few fields


def _annotation(f: PolicyField) -> Any:
    if f.choices is not None:
        return Literal[f.choices] | None  # type: ignore[valid-type]
    return Annotated[f.type, Field(ge=f.minimum, le=f.maximum, description=f.description)] | None


PolicyUpdate: type[BaseModel] = create_model(
    "PolicyUpdate",
    __config__=ConfigDict(extra="forbid", strict=True, allow_inf_nan=False),
    __doc__="Any subset of the live policy; fields left out keep their value.",
    **{f.name: (_annotation(f), None) for f in POLICY_FIELDS},
)


def _rejection(exc: ValidationError) -> JSONResponse:
    errors = exc.errors()
    first = errors[0]
    field = ".".join(str(part) for part in first.get("loc", ())) or None
    if any(e["type"] == "extra_forbidden" for e in errors):
        unknown = sorted(".".join(str(p) for p in e["loc"]) for e in errors if e["type"] == "extra_forbidden")
        names = [f.name for f in POLICY_FIELDS]
        return error_response(422, f"not policy fields: {unknown}; use {names}", param=unknown[0])
    message = f"{field}: {first['msg']}" if field else f"request body is not a JSON object of policy fields: " \
        f"{first['msg']}"
    return error_response(400, message, param=field)


def install_admin_routes(app: FastAPI, coordinator: Coordinator) -> None:
    router = APIRouter(prefix="/admin")

    @router.get("/policy")
    async def get_policy() -> dict[str, object]:
        return coordinator.config.policy()

    @router.put("/policy", openapi_extra={"requestBody": {"content": {"application/json": {
        "schema": PolicyUpdate.model_json_schema()}}, "required": True}})
    async def put_policy(request: Request) -> Any:
        try:
            update = PolicyUpdate.model_validate_json(await request.body())
        except ValidationError as exc:
            return _rejection(exc)
        try:
            return await coordinator.apply_policy(**update.model_dump(exclude_none=True))
        except InvalidRequestError as exc:
            return error_response(400, str(exc), param=exc.param)

    app.include_router(router)


def build_admin_app(coordinator: Coordinator, api_keys: ApiKeys | None = None) -> FastAPI:
    """The admin port's app: /health and /admin/policy, nothing a client of the model needs; with
    `api_keys` (the admin keys), /admin/* needs one of them."""
    app = FastAPI(title="minedraft admin", version=__version__)
    app.add_middleware(BodyLimit, max_bytes=ADMIN_MAX_BODY_BYTES)
    if api_keys:
        app.add_middleware(ApiKeyGuard, keys=api_keys, open_paths=frozenset({"/health", "/health/live"}))
    install_health_route(app, coordinator)
    install_admin_routes(app, coordinator)
    return app
