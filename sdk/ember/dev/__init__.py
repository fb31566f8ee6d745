"""Ember on one machine, for ``ember dev`` and ``make demo``: nats-server, the control plane and a node agent
as child processes of this one."""

from ember.dev.embedded import EmbeddedPlatform, nats_server_binary

__all__ = ["EmbeddedPlatform", "nats_server_binary"]
