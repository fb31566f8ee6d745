"""torch and OpenAI's client for the test files that use them, imported when one of their tests first does: not by
every xdist worker that only collects those files (a second of CPU each, while the suite starts on two cores). A
skip that depends on CUDA is a string condition (``skipif("cuda()")``, ``cuda`` given by tests/conftest.py), which
pytest evaluates when the test runs."""

from __future__ import annotations

import importlib
import sys
from types import ModuleType
from typing import Any


class _Lazy(ModuleType):
    """A module imported on its first attribute lookup."""

    def __getattr__(self, attribute: str) -> Any:
        if attribute.startswith("_") and self.__name__ not in sys.modules:
            # introspection, not use: pytest's collection looks each module-level name over (``_mock_name``)
            raise AttributeError(attribute)
        return getattr(importlib.import_module(self.__name__), attribute)


torch: Any = _Lazy("torch")
openai: Any = _Lazy("openai")


def cuda() -> bool:
    """Whether torch sees a CUDA device (the CPU build never does)."""
    return bool(torch.cuda.is_available())
