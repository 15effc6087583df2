"""Annotated dependencies shared by the routes."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from server.errors import not_ready
from server.service import TranscriptionService
from server.settings import Settings


def get_service(request: Request) -> TranscriptionService:
    """The running service; 503 before the model is warmed up and while shutting down."""
    service: TranscriptionService | None = getattr(request.app.state, "service", None)
    if service is None or not service.ready:
        raise not_ready()
    return service


def get_settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


ServiceDependency = Annotated[TranscriptionService, Depends(get_service)]
SettingsDependency = Annotated[Settings, Depends(get_settings)]
