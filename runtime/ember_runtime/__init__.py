"""Ember's node runtime: the node agent (``python -m ember_runtime``), replica and zygote processes, and the
micro-batcher. See docs/reference/code-layout.md.

Empty on purpose: importing one room (the batcher, say) loads nothing of the others.
"""
