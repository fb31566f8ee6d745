"""Ember's control plane: HTTP gateway, deployment registry and routing over NATS."""

from ember_platform.config import Settings
from ember_platform.gateway.asgi import create_app

__all__ = ["Settings", "create_app"]
