"""What a token may do, as pure functions: scopes and what they imply, app patterns, time to live, and the checks of
a token request (each refusal a 422 naming its field)."""

from __future__ import annotations

import math

import pytest

from ember._errors import ForbiddenError, InvalidInputError, NotFoundError
from ember.wire import TokenInfo, TokenRequest
from ember_platform.auth.scopes import EVERYONE, Principal, check_request, granted, no_such_app, parse_ttl


@pytest.mark.parametrize(("scopes", "allowed"), [
    (["admin"], {"admin", "deploy", "invoke", "read", "events"}),
    (["events"], {"events"}),
    (["deploy"], {"deploy", "read"}),
    (["invoke"], {"invoke"}),
    (["read"], {"read"}),
    (["invoke", "read"], {"invoke", "read"}),
    ([], set()),
    (["nonsense"], set()),
])
def test_scopes_and_what_they_imply(scopes, allowed):
    assert granted(scopes) == allowed


def _principal(scopes: list[str], apps: list[str]) -> Principal:
    return Principal.of(TokenInfo(id="t1", name="", scopes=scopes, apps=apps, created_at=0.0))


@pytest.mark.parametrize(("apps", "app", "sees"), [
    (["hello"], "hello", True),
    (["hello"], "hello2", False),
    (["hello"], "hell", False),
    (["team-a-*"], "team-a-x", True),
    (["team-a-*"], "team-a-", True),
    (["team-a-*"], "team-b-x", False),
    (["team-?"], "team-1", True),
    (["team-?"], "team-12", False),
    (["*"], "anything", True),
    (["a", "b-*"], "b-c", True),
    (["a", "b-*"], "c", False),
])
def test_app_patterns(apps, app, sees):
    assert _principal(["invoke"], apps).sees(app) is sees


def test_an_admin_sees_every_app_whatever_its_patterns():
    assert _principal(["admin"], ["hello"]).sees("other")
    assert EVERYONE.sees("x") and EVERYONE.may("admin")


def test_an_app_the_token_does_not_see_is_the_404_of_an_app_that_does_not_exist():
    principal = _principal(["invoke"], ["a"])
    with pytest.raises(NotFoundError) as hidden:
        principal.require("invoke", "b")
    assert str(hidden.value) == str(no_such_app("b")) == "no app named 'b' is deployed"
    with pytest.raises(NotFoundError):
        principal.require("deploy", "b")  # not seen: 404, even for a scope it lacks


def test_a_scope_the_token_lacks_on_an_app_it_sees_is_a_403():
    principal = _principal(["invoke"], ["a"])
    principal.require("invoke", "a")
    with pytest.raises(ForbiddenError) as refused:
        principal.require("deploy", "a")
    assert refused.value.http_status == 403 and "'deploy'" in str(refused.value)
    with pytest.raises(ForbiddenError):
        principal.require("read")


@pytest.mark.parametrize(("text", "seconds"), [("30d", 30 * 86400), ("12h", 43200), ("15m", 900), ("90s", 90),
                                               ("1s", 1), ("3650d", 3650 * 86400)])
def test_ttl(text, seconds):
    assert parse_ttl(text) == seconds


@pytest.mark.parametrize("text", ["", "0s", "-1h", "1", "1w", "1.5h", "h", "1h30m", "3651d", "99999999d", "1 h", " 2h ",
                                  "1H", "٣d", "1e3s"])
def test_a_bad_ttl_is_a_422_naming_the_field(text):
    with pytest.raises(InvalidInputError) as caught:
        parse_ttl(text)
    assert caught.value.field == "$.ttl"


def test_a_good_request():
    scopes, apps, ttl = check_request(TokenRequest(scopes=["read", "invoke", "read"], apps=["hello", "team-*"],
                                                   name="ci", ttl="30d"))
    assert (scopes, apps, ttl) == (["invoke", "read"], ["hello", "team-*"], 30 * 86400)
    assert check_request(TokenRequest(scopes=["admin"]))[1:] == (["*"], math.inf)


@pytest.mark.parametrize(("request_", "field"), [
    (TokenRequest(scopes=[]), "$.scopes"),
    (TokenRequest(scopes=["read", "root"]), "$.scopes[1]"),
    (TokenRequest(scopes=["read"], apps=[]), "$.apps"),
    (TokenRequest(scopes=["read"], apps=["ok", "Bad"]), "$.apps[1]"),
    (TokenRequest(scopes=["read"], apps=["a.b"]), "$.apps[0]"),
    (TokenRequest(scopes=["read"], apps=["[ab]"]), "$.apps[0]"),
    (TokenRequest(scopes=["read"], apps=["-a"]), "$.apps[0]"),
    (TokenRequest(scopes=["read"], apps=["x" * 64]), "$.apps[0]"),
    (TokenRequest(scopes=["read"], apps=["a"] * 101), "$.apps"),
    (TokenRequest(scopes=["admin"], apps=["hello"]), "$.apps"),
    (TokenRequest(scopes=["read"], name="x" * 65), "$.name"),
    (TokenRequest(scopes=["read"], name="a\nb"), "$.name"),
    (TokenRequest(scopes=["read"], ttl="forever"), "$.ttl"),
])
def test_a_bad_request_is_a_422_naming_the_field(request_, field):
    with pytest.raises(InvalidInputError) as caught:
        check_request(request_)
    assert caught.value.field == field
