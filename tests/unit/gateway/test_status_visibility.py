"""``GET /v1/status`` for a token that sees some apps: on each node, only those apps' replicas, zygotes and warm
starts (``gateway/status.py``'s ``visible``); another tenant's warm start is not even named."""

from __future__ import annotations

from ember.wire import NodeView, StatusView
from ember_platform.auth.scopes import Principal
from ember_platform.gateway.status import visible

VIEW = StatusView(nodes=[NodeView(node_id="n1", hostname="h", updated_at=0.0, devices=[],
                                  warm_starts={"team-a-chat": "ready", "team-b-secret-app": "starting"})],
                  services=[])


def test_a_token_sees_only_its_apps_warm_starts():
    team_a = Principal("t-a", frozenset({"invoke"}), ["team-a-*"])
    assert visible(VIEW, team_a).nodes[0].warm_starts == {"team-a-chat": "ready"}
    nobody = Principal("t-x", frozenset({"invoke"}), ["other"])
    assert visible(VIEW, nobody).nodes[0].warm_starts == {}
    admin = Principal("t-admin", frozenset({"admin"}), [])
    assert visible(VIEW, admin).nodes[0].warm_starts == VIEW.nodes[0].warm_starts
