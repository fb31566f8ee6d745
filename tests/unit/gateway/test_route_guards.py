"""Every route of the table declares what it needs, so that a new route cannot forget the token check."""

from __future__ import annotations

from ember_platform.gateway import calls, guard
from ember_platform.gateway.asgi import ROUTES

# the probes (Ember's and the Open Inference Protocol's), and the console's static files
OPEN_PATHS = {"/healthz", "/readyz", "/v2/health/live", "/v2/health/ready", "/ui", "/ui/{name}"}
NEEDS = {"token", "admin", "deploy", "invoke", "read", "events"}


def _routes() -> list[tuple[str, str, str | None]]:
    return [(method, route.path, getattr(route.endpoint, guard.NEED, None))
            for route in ROUTES for method in sorted(route.methods - {"HEAD"})]


def test_every_route_declares_what_it_needs():
    undeclared = [(method, path) for method, path, need in _routes() if need is None]
    assert undeclared == []


def test_only_the_probes_and_the_console_s_static_files_are_open():
    assert {path for _, path, need in _routes() if need == guard.OPEN} == OPEN_PATHS
    assert all(need in NEEDS for _, path, need in _routes() if path not in OPEN_PATHS)


def test_a_route_is_checked_by_its_wrapper_unless_its_handler_checks_itself():
    for route in ROUTES:
        if route.path in OPEN_PATHS:
            continue
        wrapped = getattr(route.endpoint, "__wrapped__", None)
        assert wrapped is not None or route.endpoint is calls.invoke, route.path
    # The synchronous call checks itself (after finding the function: a public one needs no token); the gateway's
    # hot path calls that same handler.
    assert getattr(calls.invoke, guard.NEED) == "invoke"
    assert not hasattr(calls.invoke, "__wrapped__")


def test_what_the_routes_need():
    table = {(method, path): need for method, path, need in _routes()}
    assert table[("POST", "/v1/tokens")] == table[("GET", "/v1/tokens")] == "admin"
    assert table[("DELETE", "/v1/tokens/{token_id:token}")] == "admin"
    assert table[("GET", "/v1/tokens/self")] == "token"
    assert table[("PUT", "/v1/quotas/{quota}")] == table[("GET", "/v1/quotas")] == "admin"
    assert table[("DELETE", "/v1/quotas/{quota}")] == "admin"
    assert table[("GET", "/v1/subjects")] == table[("POST", "/v1/subjects/grant")] == "admin"
    assert table[("POST", "/v1/subjects/revoke")] == "admin"
    assert table[("PUT", "/v1/bundles/{sha256}")] == table[("POST", "/v1/apps/{app}/deployments")] == "deploy"
    assert table[("POST", "/v1/apps/{app}/scale")] == table[("DELETE", "/v1/apps/{app}")] == "deploy"
    assert table[("POST", "/v1/apps/{app}/promote")] == table[("POST", "/v1/apps/{app}/rollback")] == "deploy"
    assert table[("POST", "/v1/{app}/{name}")] == table[("POST", "/v1/{app}/{name}/spawn")] == "invoke"
    assert table[("GET", "/v1/calls/{call_id}")] == table[("DELETE", "/v1/calls/{call_id}")] == "invoke"
    assert table[("POST", "/v1/apps/{app}/dead/replay")] == "invoke"
    assert table[("POST", "/v1/events/{subject}")] == "events"
    for path in ("/v2", "/v2/models", "/v2/models/{model}", "/v2/models/{model}/ready",
                 "/v2/models/{model}/config", "/v2/models/{model}/versions/{version}"):
        assert table[("GET", path)] == "read", path
    assert table[("POST", "/v2/repository/index")] == "read"
    assert table[("POST", "/v2/models/{model}/infer")] == "invoke"
    assert table[("POST", "/v2/models/{model}/versions/{version}/infer")] == "invoke"
    for path in ("/v1/apps", "/v1/apps/{app}", "/v1/apps/{app}/logs", "/v1/apps/{app}/dead", "/v1/status",
                 "/metrics", "/openapi.json", "/v1/stats"):
        assert table[("GET", path)] == "read", path
