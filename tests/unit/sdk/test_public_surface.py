"""``ember``'s public names are pinned: adding or removing one is a deliberate change to this list."""

import inspect

import pytest

import ember

PUBLIC = [
    "App",
    "BadRequestError",
    "Batch",
    "CallCancelledError",
    "CallContext",
    "CallCycleError",
    "ConflictError",
    "ConnectionError",
    "Continuous",
    "Cron",
    "DeadlineExceededError",
    "EmberError",
    "ForbiddenError",
    "Function",
    "FunctionCall",
    "FunctionHandle",
    "Image",
    "InvalidInputError",
    "InvalidSpecError",
    "MethodHandle",
    "NotFoundError",
    "OverloadedError",
    "PayloadTooLargeError",
    "Period",
    "RateLimitedError",
    "RemoteError",
    "Retries",
    "Sequence",
    "Tensor",
    "UnauthenticatedError",
    "UnavailableError",
    "Volume",
    "__version__",
    "current_call",
    "deploy",
    "health",
    "lookup",
    "method",
    "mounted",
    "openai",
    "promote",
    "rollback",
    "setup",
    "teardown",
]


def test_all_is_pinned() -> None:
    assert ember.__all__ == PUBLIC


def test_all_is_sorted_and_unique() -> None:
    assert ember.__all__ == sorted(set(ember.__all__))


@pytest.mark.parametrize("name", PUBLIC)
def test_every_public_name_exists(name: str) -> None:
    assert getattr(ember, name) is not None


def test_no_other_public_names() -> None:
    public = {name for name in vars(ember) if not name.startswith("_")}
    modules = {name for name in public if inspect.ismodule(getattr(ember, name))}
    assert public - modules == set(PUBLIC) - {"__version__", "openai"}  # ember.openai: a module of the surface


def test_star_import_gives_exactly_all() -> None:
    namespace: dict[str, object] = {}
    exec("from ember import *", namespace)
    assert set(namespace) - {"__builtins__"} == set(PUBLIC)


@pytest.mark.parametrize("name", [n for n in PUBLIC if n != "__version__"])
def test_public_objects_are_documented(name: str) -> None:
    assert inspect.getdoc(getattr(ember, name))


def test_version_is_a_string() -> None:
    assert isinstance(ember.__version__, str)
    assert ember.__version__.count(".") >= 2
