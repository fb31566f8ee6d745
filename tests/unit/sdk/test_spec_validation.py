"""Decorators validate their arguments at once and say how to fix a bad call."""

import math

import msgspec
import pytest

import ember
from ember.wire import FunctionSpec, ServiceSpec
from ember.wire.validate import manifest_problems


def _spec(app: ember.App, name: str) -> ServiceSpec:
    return app.services[name]


# --- App names ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["hello", "a", "0abc", "my-app-2", "a" * 63, "app-"])
def test_app_accepts_valid_names(name: str) -> None:
    assert ember.App(name).name == name


@pytest.mark.parametrize("name", ["", "Hello", "-app", "my_app", "my.app", "my app", "a" * 64, "app>", "app*", "ä"])
def test_app_rejects_invalid_names(name: str) -> None:
    with pytest.raises(ember.InvalidSpecError, match="lowercase letters, digits and '-'"):
        ember.App(name)


@pytest.mark.parametrize("name", [None, 3, b"hello"])
def test_app_rejects_non_string_names(name: object) -> None:
    with pytest.raises(ember.InvalidSpecError):
        ember.App(name)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ["apps", "bundles", "calls", "healthz", "readyz"])
def test_app_rejects_reserved_names(name: str) -> None:
    with pytest.raises(ember.InvalidSpecError, match=r"not one of \[.*'healthz'"):
        ember.App(name)


def test_app_rejects_trailing_newline() -> None:
    with pytest.raises(ember.InvalidSpecError):
        ember.App("hello\n")


def test_invalid_spec_error_is_a_value_error() -> None:
    with pytest.raises(ValueError):
        ember.App("Bad")


# --- @app.function resources -------------------------------------------------------------------


@pytest.mark.parametrize(("gpu", "count", "types"), [
    (None, 0, []),
    (0, 0, []),
    (1, 1, []),
    (8, 8, []),
    ("A10G", 1, ["A10G"]),
    ("H100:2", 2, ["H100"]),
    ("any", 1, []),
    ("any:4", 4, []),
    (["H100", "A100"], 1, ["H100", "A100"]),
    (("L4",), 1, ["L4"]),
])
def test_gpu_forms_accepted(gpu: object, count: int, types: list[str]) -> None:
    app = ember.App("gpus")

    @app.function(gpu=gpu)
    def f() -> int:
        return 1

    spec = _spec(app, "f")
    assert (spec.gpu_count, spec.gpu_types) == (count, types)


@pytest.mark.parametrize("gpu", [-1, 9, True, False, 1.5, "", "H100:0", "H100:9", "H 100", "H100:2:3", [],
                                 ["H100", 3], {"H100"}, ["bad type"]])
def test_gpu_forms_rejected_with_a_hint(gpu: object) -> None:
    app = ember.App("gpus")
    with pytest.raises(ember.InvalidSpecError, match=r'gpu="H100:2"'):
        app.function(gpu=gpu)


def test_gpu_list_entries_are_bare_types() -> None:
    app = ember.App("gpus")
    try:
        @app.function(gpu=["H100:2", "A100"])
        def f() -> int:
            return 1
    except ember.InvalidSpecError:
        return
    assert all(":" not in t for t in _spec(app, "f").gpu_types)


@pytest.mark.parametrize(("kwargs", "expected"), [
    ({}, (1, 1)),
    ({"min_replicas": 0}, (0, 1)),
    ({"min_replicas": 3}, (3, 3)),
    ({"min_replicas": 0, "max_replicas": 4}, (0, 4)),
    ({"min_replicas": 2, "max_replicas": 2}, (2, 2)),
])
def test_replica_bounds_accepted(kwargs: dict[str, int], expected: tuple[int, int]) -> None:
    app = ember.App("replicas")

    @app.function(**kwargs)
    def f() -> int:
        return 1

    spec = _spec(app, "f")
    assert (spec.min_replicas, spec.max_replicas) == expected


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"min_replicas": -1}, "min_replicas is an int >= 0"),
    ({"min_replicas": True}, "min_replicas is an int >= 0"),
    ({"min_replicas": 1.5}, "min_replicas is an int >= 0"),
    ({"min_replicas": "1"}, "min_replicas is an int >= 0"),
    ({"min_replicas": 100_000}, "at most 1000"),
    ({"max_replicas": 100_000}, "at most 1000"),
    ({"max_replicas": 0}, "max_replicas is an int >= 1"),
    ({"min_replicas": 0, "max_replicas": 0}, "max_replicas is an int >= 1"),
    ({"min_replicas": 3, "max_replicas": 2}, r"and >= min_replicas \(3\)"),
    ({"max_replicas": True}, "max_replicas is an int"),
    ({"max_replicas": 2.0}, "max_replicas is an int"),
])
def test_replica_bounds_rejected(kwargs: dict[str, object], message: str) -> None:
    app = ember.App("replicas")
    with pytest.raises(ember.InvalidSpecError, match=message):
        app.function(**kwargs)  # type: ignore[arg-type]
    with pytest.raises(ember.InvalidSpecError, match=message):
        app.model(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("timeout_s", [0.5, 1, 60.0, 86400])
def test_timeout_accepted_and_stored_as_float(timeout_s: float) -> None:
    app = ember.App("timeouts")

    @app.function(timeout_s=timeout_s)
    def f() -> int:
        return 1

    assert _spec(app, "f").timeout_s == timeout_s
    assert isinstance(_spec(app, "f").timeout_s, float)


@pytest.mark.parametrize("timeout_s", [0, -1, 86401, True, "60", math.nan, math.inf, None])
def test_timeout_rejected(timeout_s: object) -> None:
    app = ember.App("timeouts")
    with pytest.raises(ember.InvalidSpecError, match=r"timeout_s is a number of seconds in \(0, 86400\]"):
        app.function(timeout_s=timeout_s)  # type: ignore[arg-type]
    with pytest.raises(ember.InvalidSpecError, match="timeout_s is a number"):
        app.model(timeout_s=timeout_s)  # type: ignore[arg-type]


@pytest.mark.parametrize("startup", [0, -1, 86401, True, "60", math.nan, None])
def test_startup_timeout_rejected(startup: object) -> None:
    app = ember.App("startups")
    with pytest.raises(ember.InvalidSpecError, match=r"startup_timeout_s=.*seconds in \(0, 86400\]"):
        app.function(startup_timeout_s=startup)  # type: ignore[arg-type]
    with pytest.raises(ember.InvalidSpecError, match="startup_timeout_s"):
        app.model(startup_timeout_s=startup)  # type: ignore[arg-type]


def test_startup_timeout_defaults_to_ten_minutes_and_is_kept() -> None:
    app = ember.App("startups")

    @app.function()
    def f() -> int:
        return 1

    @app.function(startup_timeout_s=30)
    def g() -> int:
        return 1

    assert (_spec(app, "f").startup_timeout_s, _spec(app, "g").startup_timeout_s) == (600.0, 30.0)


@pytest.mark.parametrize("target", [None, 1, 0.5, 250, 30_000.0])
def test_latency_target_accepted(target: float | None) -> None:
    app = ember.App("latency")

    @app.function(target_p95_ms=target)
    def f() -> int:
        return 1

    @app.model(target_p95_ms=target)
    class M:
        @ember.method
        def g(self) -> int:
            return 1

    for name in ("f", "M"):
        assert _spec(app, name).target_p95_ms == target
        assert target is None or isinstance(_spec(app, name).target_p95_ms, float)


@pytest.mark.parametrize("target", [0, -1, -0.5, True, "250", "250ms", math.nan, math.inf, [250]])
def test_latency_target_rejected(target: object) -> None:
    app = ember.App("latency")
    for decorator, where in ((app.function, "function"), (app.model, "model")):
        with pytest.raises(ember.InvalidSpecError,
                           match=rf"@app\.{where}\(target_p95_ms=.*\): target_p95_ms is a positive number"):
            decorator(target_p95_ms=target)  # type: ignore[operator]


def test_new_service_spec_fields_go_last_with_defaults() -> None:
    # Schemas only grow: an older peer's manifest (without them) still decodes.
    assert ServiceSpec.__struct_fields__[-6:] == ("target_p95_ms", "startup_timeout_s", "secrets", "volumes", "image",
                                                  "block_network")
    assert ServiceSpec.__struct_defaults__[-6:-4] == (None, 600.0)
    spec = ServiceSpec(name="f", kind="function", functions=[])
    assert spec.secrets == [] and spec.volumes == [] and spec.image is None and spec.block_network is False


def test_model_resources_are_validated_like_functions() -> None:
    app = ember.App("models")
    with pytest.raises(ember.InvalidSpecError, match=r"@app\.model\(gpu=9\)"):
        app.model(gpu=9)


# --- batch -------------------------------------------------------------------------------------


@pytest.mark.parametrize("batch", [32, {"max_size": 8}, "32", True])
def test_function_batch_must_be_a_batch(batch: object) -> None:
    app = ember.App("batches")
    with pytest.raises(ember.InvalidSpecError, match=r"pass ember\.Batch\(max_size=\.\.\., window_ms=\.\.\.\)"):
        app.function(batch=batch)  # type: ignore[arg-type]


def test_batch_hint_reuses_an_int_size() -> None:
    with pytest.raises(ember.InvalidSpecError, match=r"batch=ember\.Batch\(max_size=16\)"):
        ember.method(batch=16)  # type: ignore[call-overload]


def test_method_batch_must_be_a_batch() -> None:
    with pytest.raises(ember.InvalidSpecError, match=r"@ember\.method\(batch="):
        ember.method(batch={"max_size": 8})  # type: ignore[call-overload]


@pytest.mark.parametrize(("max_size", "window_ms"), [(1, 0), (4096, 10_000), (32, 2.5), (8, 5)])
def test_batch_bounds_accepted(max_size: int, window_ms: float) -> None:
    batch = ember.Batch(max_size=max_size, window_ms=window_ms)
    assert (batch.max_size, batch.window_ms) == (max_size, window_ms)


def test_batch_defaults() -> None:
    assert ember.Batch() == ember.Batch(max_size=32, window_ms=5.0)


@pytest.mark.parametrize("max_size", [0, -1, 4097, True, 2.5, "8", None])
def test_batch_max_size_rejected(max_size: object) -> None:
    with pytest.raises(ember.InvalidSpecError, match="max_size must be an int from 1 to 4096"):
        ember.Batch(max_size=max_size)  # type: ignore[arg-type]


@pytest.mark.parametrize("window_ms", [-1, -0.1, 10_001, True, "5", None])
def test_batch_window_rejected(window_ms: object) -> None:
    with pytest.raises(ember.InvalidSpecError, match="window_ms must be a number of milliseconds from 0 to 10000"):
        ember.Batch(window_ms=window_ms)  # type: ignore[arg-type]


def _typed_lists(xs: list[int]) -> list[str]:
    return [str(x) for x in xs]


def _bare_lists(xs: list) -> list:  # type: ignore[type-arg]
    return [str(x) for x in xs]


@pytest.mark.parametrize("raw", [_typed_lists, _bare_lists])
def test_batched_function_accepted(raw: object) -> None:
    app = ember.App("batches")
    handle = app.function(batch=ember.Batch(max_size=4))(raw)  # type: ignore[arg-type]
    (fn,) = _spec(app, handle.function_name).functions
    assert fn.batch == ember.Batch(max_size=4)
    assert fn.input_mode == "single"
    assert handle.local([1, 2]) == ["1", "2"]


def test_batched_function_schema_is_of_one_item() -> None:
    app = ember.App("batches")

    @app.function(batch=ember.Batch())
    def f(xs: list[int]) -> list[str]:
        return [str(x) for x in xs]

    (fn,) = _spec(app, "f").functions
    assert fn.input_schema == {"type": "integer"}
    assert fn.output_schema == {"type": "string"}


def _no_params() -> list[int]:
    return []


def _two_params(xs: list[int], ys: list[int]) -> list[int]:
    return xs


def _not_a_list(x: int) -> list[int]:
    return [x]


def _returns_item(xs: list[int]) -> int:
    return 0


def _unannotated_return(xs: list[int]):  # type: ignore[no-untyped-def]
    return xs


@pytest.mark.parametrize(("fn", "message"), [
    (_no_params, "takes exactly one parameter, a list of inputs"),
    (_two_params, "takes exactly one parameter, a list of inputs"),
    (_not_a_list, r"annotated `\(xs: list\[In\]\) -> list\[Out\]`"),
    (_returns_item, r"annotated `\(xs: list\[In\]\) -> list\[Out\]`"),
    (_unannotated_return, "annotate both the parameter and the return as lists"),
])
def test_batched_function_must_map_a_list_to_a_list(fn: object, message: str) -> None:
    app = ember.App("batches")
    with pytest.raises(ember.InvalidSpecError, match=message):
        app.function(batch=ember.Batch())(fn)  # type: ignore[arg-type]
    assert app.services == {}


def test_batched_method_must_map_a_list_to_a_list() -> None:
    with pytest.raises(ember.InvalidSpecError, match="takes exactly one parameter"):
        class Model:
            @ember.method(batch=ember.Batch())
            def predict(self, x: int, y: int) -> list[int]:
                return [x, y]


# --- decorated objects -------------------------------------------------------------------------


def test_function_without_parentheses() -> None:
    app = ember.App("bare")

    @app.function
    def greet(name: str) -> str:
        return f"Hello, {name}!"

    assert isinstance(greet, ember.Function)
    assert greet.local("Ada") == "Hello, Ada!"
    spec = _spec(app, "greet")
    assert spec.kind == "function"
    assert (spec.gpu_count, spec.min_replicas, spec.max_replicas, spec.timeout_s) == (0, 1, 1, 60.0)
    assert spec.functions == [FunctionSpec(name="greet", attr="greet", input_mode="single", params=["name"],
                                           input_schema={"type": "string"}, output_schema={"type": "string"})]


def test_method_without_parentheses() -> None:
    app = ember.App("bare")

    @app.model()
    class Model:
        @ember.method
        def predict(self, x: int) -> int:
            return x

    assert [f.name for f in _spec(app, "Model").functions] == ["Model.predict"]


@pytest.mark.parametrize("target", [int, 42, print])
def test_function_decorates_only_functions(target: object) -> None:
    app = ember.App("wrong")
    with pytest.raises(ember.InvalidSpecError, match=r"decorates a function"):
        app.function()(target)  # type: ignore[arg-type]


def test_model_decorates_only_classes() -> None:
    app = ember.App("wrong")

    def f() -> int:
        return 1

    with pytest.raises(ember.InvalidSpecError, match="decorates a class"):
        app.model()(f)  # type: ignore[type-var]


def test_method_and_setup_decorate_only_functions() -> None:
    with pytest.raises(ember.InvalidSpecError, match=r"@ember\.method decorates a method"):
        ember.method(staticmethod(lambda x: x))
    with pytest.raises(ember.InvalidSpecError, match=r"@ember\.setup decorates a method"):
        ember.setup(42)


def test_setup_takes_only_self() -> None:
    with pytest.raises(ember.InvalidSpecError, match=r"load\(\) takes only `self`"):
        class Model:
            @ember.setup
            def load(self, path: str) -> None:
                pass


def test_setup_with_parentheses() -> None:
    class Model:
        @ember.setup()
        def load(self) -> None:
            self.ready = True

    assert Model.load.__ember_setup__ == "replica"  # type: ignore[attr-defined]


def test_snap_setup_runs_first_and_marks_the_service() -> None:
    app = ember.App("snappy")
    order: list[str] = []

    @app.model()
    class Model:
        @ember.setup
        def to_device(self) -> None:
            order.append("replica")

        @ember.setup(snap=True)
        def load(self) -> None:
            order.append("snap")

        @ember.method
        def f(self, x: int) -> int:
            return x

    @app.model()
    class Plain:
        @ember.setup
        def load(self) -> None:
            pass

        @ember.method
        def g(self, x: int) -> int:
            return x

    assert app.services["Model"].snap and not app.services["Plain"].snap
    from ember._setup import run_setup

    run_setup(Model(), snap=True)
    run_setup(Model(), snap=False)
    run_setup(Model())
    assert order == ["snap", "replica", "snap", "replica"]


def test_star_args_are_refused() -> None:
    app = ember.App("stars")

    def f(*xs: int) -> int:
        return 0

    def g(**kw: int) -> int:
        return 0

    for fn in (f, g):
        with pytest.raises(ember.InvalidSpecError, match="name each parameter"):
            app.function()(fn)


def test_unresolvable_annotations_are_refused() -> None:
    app = ember.App("refs")

    def f(x: "Nope") -> int:  # type: ignore[name-defined]  # noqa: F821
        return 0

    with pytest.raises(ember.InvalidSpecError, match="cannot resolve its type annotations"):
        app.function()(f)


def test_non_json_types_are_refused() -> None:
    app = ember.App("types")

    class Opaque:
        pass

    def f(x: Opaque) -> int:
        return 0

    with pytest.raises(ember.InvalidSpecError, match="not JSON-able types"):
        app.function()(f)
    assert app.services == {}


def _lambda_fn() -> object:
    return lambda: 1


def grüße() -> str:
    return "hallo"


@pytest.mark.parametrize("fn", [_lambda_fn(), grüße], ids=["lambda", "non-ascii"])
def test_function_names_must_be_subject_tokens(fn: object) -> None:
    app = ember.App("names")
    with pytest.raises(ember.InvalidSpecError):
        app.function()(fn)  # type: ignore[arg-type]


# --- classes -----------------------------------------------------------------------------------


def test_model_without_methods() -> None:
    app = ember.App("models")
    with pytest.raises(ember.InvalidSpecError, match=r"class Empty has no @ember\.method to serve"):
        @app.model()
        class Empty:
            def predict(self, x: int) -> int:
                return x


def test_model_whose_init_needs_arguments() -> None:
    app = ember.App("models")
    with pytest.raises(ember.InvalidSpecError,
                       match=r"Model\(\) must be constructible without arguments; load state in an "
                             r"@ember.setup method instead of __init__\(path, device\)"):
        @app.model()
        class Model:
            def __init__(self, path: str, device: str, *args: object, flag: bool = False, **kw: object) -> None:
                pass

            @ember.method
            def predict(self, x: int) -> int:
                return x


def test_model_whose_init_has_defaults_is_accepted() -> None:
    app = ember.App("models")

    @app.model(gpu="A10G", min_replicas=0, max_replicas=3, timeout_s=5)
    class Model:
        def __init__(self, path: str = "w.pt", *args: object, **kwargs: object) -> None:
            self.path = path

        @ember.method
        def predict(self, x: int) -> int:
            return x

        @ember.method(batch=ember.Batch(max_size=8))
        def embed(self, xs: list[str]) -> list[float]:
            return [0.0] * len(xs)

    spec = _spec(app, "Model")
    assert (spec.kind, spec.gpu_count, spec.gpu_types) == ("class", 1, ["A10G"])
    assert (spec.min_replicas, spec.max_replicas, spec.timeout_s) == (0, 3, 5.0)
    assert [(f.name, f.attr, f.batch) for f in spec.functions] == [
        ("Model.predict", "predict", None),
        ("Model.embed", "embed", ember.Batch(max_size=8)),
    ]
    assert app.target("Model") is Model
    assert Model.__ember_app__ == "models"  # type: ignore[attr-defined]


def test_model_inherits_methods_from_a_base_class() -> None:
    app = ember.App("models")

    class Base:
        @ember.method
        def predict(self, x: int) -> int:
            return x

    @app.model()
    class Child(Base):
        pass

    assert [f.name for f in _spec(app, "Child").functions] == ["Child.predict"]


# --- duplicates and the manifest ---------------------------------------------------------------


def test_duplicate_function_names() -> None:
    app = ember.App("dupes")

    @app.function()
    def f() -> int:
        return 1

    with pytest.raises(ember.InvalidSpecError, match="already serves 'f'; give each function a unique name"):
        @app.function()  # type: ignore[no-redef]
        def f() -> int:
            return 2

    assert app.target("f").local() == 1


def test_function_and_class_with_the_same_name() -> None:
    app = ember.App("dupes")

    @app.function()
    def Model() -> int:
        return 1

    with pytest.raises(ember.InvalidSpecError, match="already serves 'Model'"):
        @app.model()  # type: ignore[no-redef]
        class Model:
            @ember.method
            def predict(self, x: int) -> int:
                return x


def test_same_name_in_two_apps_is_fine() -> None:
    def f() -> int:
        return 1

    one, two = ember.App("one"), ember.App("two")
    one.function()(f)
    two.function()(f)
    assert list(one.services) == list(two.services) == ["f"]


def test_manifest_lists_services_in_declaration_order() -> None:
    app = ember.App("shop")

    @app.function()
    def b() -> int:
        return 1

    @app.function()
    def a() -> int:
        return 1

    manifest = app.manifest("shop_main")
    assert (manifest.app, manifest.module) == ("shop", "shop_main")
    assert [s.name for s in manifest.services] == ["b", "a"]
    assert manifest.sdk_version == ember.__version__
    assert manifest.python.count(".") == 1
    assert "shop" in repr(app) and "b, a" in repr(app)


def test_grouping_by_cost_needs_a_cost_bound() -> None:
    with pytest.raises(ember.InvalidSpecError, match=r"group_by_cost=True.*max_cost"):
        ember.Batch(max_size=8, group_by_cost=True)
    with pytest.raises(ember.InvalidSpecError, match="group_by_cost is True or False"):
        ember.Batch(max_size=8, max_cost=100, group_by_cost="yes")  # type: ignore[arg-type]
    assert ember.Batch(max_size=8, max_cost=100, group_by_cost=True).group_by_cost


@pytest.mark.parametrize(("memory", "mb"), [(512, 512), ("4GB", 4096), ("1.5 gb", 1536), ("256MB", 256)])
def test_host_memory_is_declared_in_mb_or_with_a_unit(memory, mb) -> None:
    app = ember.App("mem")

    @app.function(memory=memory)
    def f(x: int) -> int:
        return x

    assert app.services["f"].memory_mb == mb


@pytest.mark.parametrize("memory", [0, -1, True, "4 TB", "lots", 2.5])
def test_a_bad_host_memory_names_the_argument(memory) -> None:
    app = ember.App("mem")
    with pytest.raises(ember.InvalidSpecError, match=r"@app.model\(memory="):
        @app.model(memory=memory)
        class Model:
            @ember.method
            def f(self, x: int) -> int:
                return x


def test_secrets_are_names_checked_at_once_and_by_the_validator() -> None:
    app = ember.App("with-secrets")

    @app.function(secrets=["hf", "db-1"])
    def f(x: int) -> int:
        return x

    assert _spec(app, "f").secrets == ["hf", "db-1"]
    for bad in ("hf", ["HF"], ["a b"], ["hf", "hf"], [1]):
        with pytest.raises(ember.InvalidSpecError, match=r"@app\.function\(secrets="):
            app.function(secrets=bad)  # type: ignore[arg-type]
    with pytest.raises(ember.InvalidSpecError, match=r"@app\.model\(secrets="):
        app.model(secrets=["Bad"])
    manifest = app.manifest("m")
    svc = msgspec.structs.replace(manifest.services[0], secrets=["ok", "Not_ok", "ok"])
    problems = list(manifest_problems(msgspec.structs.replace(manifest, services=[svc])))
    at = "$.manifest.services[0].secrets"
    assert [field for field, _ in problems] == [f"{at}[1]", f"{at}[2]"]
