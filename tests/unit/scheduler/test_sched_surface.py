"""``ember_platform.scheduler``'s public names are pinned, and its policies stay pure."""

from __future__ import annotations

import ast
from pathlib import Path

import ember_platform.scheduler as scheduler

PUBLIC = [
    "AutoscaleConfig",
    "AutoscaleState",
    "Binding",
    "Cluster",
    "Decision",
    "GpuRequest",
    "Load",
    "Meter",
    "Move",
    "MoveBudget",
    "PlacementRequest",
    "Priority",
    "Reservation",
    "Signals",
    "Snapshot",
    "Unschedulable",
    "apply_decisions",
    "build_snapshot",
    "describe",
    "desired_replicas",
    "initial_state",
    "measure",
    "parse_gpu",
    "place",
    "place_and_apply",
    "rebalance",
    "request_from_spec",
]

PURE_IMPORTS = {"__future__", "bisect", "collections", "dataclasses", "itertools", "math", "msgspec", "re", "typing",
                "ember", "ember_platform"}


def test_all_is_pinned_sorted_and_present() -> None:
    assert scheduler.__all__ == PUBLIC == sorted(PUBLIC)
    assert all(getattr(scheduler, name) is not None for name in PUBLIC)


def _parse(source: str) -> ast.Module:
    """``ast.parse``, once more where CPython 3.11 (before 3.11.10) mistook its AST depth count, which another thread
    formatting a traceback (3.11 parses its lines for the carets) can upset: "AST constructor recursion depth
    mismatch" (python/cpython#106905)."""
    try:
        return ast.parse(source)
    except SystemError:
        return ast.parse(source)


def test_policies_import_nothing_that_does_io() -> None:
    for path in Path(scheduler.__file__).parent.glob("*.py"):
        tree = _parse(path.read_text())
        modules = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
        modules |= {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
        roots = {m.partition(".")[0] for m in modules}
        assert roots <= PURE_IMPORTS, (path.name, roots - PURE_IMPORTS)
        assert "ember_runtime" not in modules
