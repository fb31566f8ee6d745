"""The digits classifier's weights, as the volume its replicas mount at ``/weights``.

From a shell: ``ember volume put digits-weights examples/digits/weights.pt`` (then ``ember push
examples/digits/classifier.py``); from Python (the demo, the tests, the benchmarks): ``put()``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from ember._volume import PutProgress, put_volume

if TYPE_CHECKING:
    from ember._client import Transport
    from ember.wire import VolumeView

NAME = "digits-weights"
WEIGHTS = Path(__file__).resolve().parent / "weights.pt"  # written by train.py


def put(transport: Transport | None = None,
        progress: Callable[[PutProgress], None] | None = None) -> VolumeView:
    """Put ``weights.pt`` as a new version of the ``digits-weights`` volume (nothing is sent when it is stored)."""
    return put_volume(NAME, [WEIGHTS], transport=transport, progress=progress)
