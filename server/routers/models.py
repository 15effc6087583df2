"""GET /v1/models and /v1/models/{id}: the served model under each of its names."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from server.errors import model_not_found, not_ready
from server.service import TranscriptionService

OWNER = "whisper-serve"

router = APIRouter(tags=["models"])


def _names(request: Request) -> list[str]:
    service: TranscriptionService | None = getattr(request.app.state, "service", None)
    if service is None:
        raise not_ready()
    return service.model_names


def _model(name: str, created: int) -> dict[str, Any]:
    return {"id": name, "object": "model", "created": created, "owned_by": OWNER}


@router.get("/v1/models", summary="List the served models")
async def list_models(request: Request) -> dict[str, Any]:
    created = request.app.state.started_at
    return {"object": "list", "data": [_model(name, created) for name in _names(request)]}


@router.get("/v1/models/{model_id:path}", summary="Describe one served model")
async def retrieve_model(model_id: str, request: Request) -> dict[str, Any]:
    if model_id not in _names(request):
        raise model_not_found(model_id)
    return _model(model_id, request.app.state.started_at)
