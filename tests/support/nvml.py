"""What the fake nvidia-ml-py modules share."""

from __future__ import annotations


class NVMLError(Exception):
    """The error a fake ``pynvml`` raises (``NVMLError`` on the fake modules), as the real one does."""
