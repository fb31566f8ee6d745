"""Ember's control plane: HTTP gateway, deployment registry and routing over NATS."""

from ember_platform._app import create_app
from ember_platform._config import Settings

__all__ = ["Settings", "create_app"]
