"""Ember's node runtime: node agent, replica processes, micro-batcher and model backends."""

from ember_runtime.agent.node import NodeAgent
from ember_runtime.batching.batcher import Batcher, Call

__all__ = ["Batcher", "Call", "NodeAgent"]
