"""The replica process (``python -m ember_runtime.replica``): endpoints, the queue worker and the answers to
synchronous calls; its batching lives in ``ember_runtime.batching``."""
