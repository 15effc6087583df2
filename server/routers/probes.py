"""Liveness, readiness and metrics: what an orchestrator and a scraper call."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from server.errors import not_ready

router = APIRouter(tags=["probes"])


@router.get("/health", summary="Liveness: the process answers")
async def health() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/ready", summary="Readiness: the model is loaded and warmed up")
async def ready(request: Request) -> dict[str, str]:
    service = getattr(request.app.state, "service", None)
    if service is None or not service.ready:
        raise not_ready()
    pool = getattr(request.app.state, "pool", None)
    if pool is not None and pool.healthy_engines == 0:  # every engine is restarting
        raise not_ready()
    return {"status": "ready"}


@router.get("/metrics", summary="Prometheus metrics")
async def metrics(request: Request) -> Response:
    content, media_type = request.app.state.metrics.exposition()
    return Response(content, media_type=media_type)
