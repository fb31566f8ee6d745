"""Ember's node runtime: node agent, replica processes, micro-batcher and model backends."""

from ember_runtime._agent import NodeAgent
from ember_runtime._batcher import Batcher, Call

__all__ = ["Batcher", "Call", "NodeAgent"]
