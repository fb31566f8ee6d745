"""A quota request is checked field by field (422 naming the field), and matched to apps and tokens."""

from __future__ import annotations

import pytest

from ember._errors import InvalidInputError
from ember._quotas import parse_memory_mb, parse_rate
from ember.wire import Quota, QuotaRequest
from ember_platform.quotas.rules import applies_to_call, check_name, check_request, covers_app


@pytest.mark.parametrize(("request_", "field"), [
    (QuotaRequest(max_replicas=1), "$.apps"),
    (QuotaRequest(apps="a", token="abc", max_replicas=1), "$.apps"),
    (QuotaRequest(apps="Team A", max_replicas=1), "$.apps"),
    (QuotaRequest(token="NOT-AN-ID", rate_per_s=1.0), "$.token"),
    (QuotaRequest(apps="a", max_replicas=-1), "$.max_replicas"),
    (QuotaRequest(apps="a", max_gpu_memory_mb=-5), "$.max_gpu_memory_mb"),
    (QuotaRequest(apps="a", max_concurrent_calls=10**9), "$.max_concurrent_calls"),
    (QuotaRequest(apps="a", rate_per_s=0.0), "$.rate_per_s"),
    (QuotaRequest(apps="a", rate_per_s=float("nan")), "$.rate_per_s"),
    (QuotaRequest(apps="a", rate_per_s=1.0, burst=0), "$.burst"),
    (QuotaRequest(apps="a", max_replicas=1, burst=3), "$.burst"),
    (QuotaRequest(token="abc", max_replicas=1), "$.max_replicas"),
    (QuotaRequest(token="abc", max_gpu_memory_mb=1), "$.max_gpu_memory_mb"),
    (QuotaRequest(apps="a"), "$"),
])
def test_a_bad_request_names_its_field(request_: QuotaRequest, field: str) -> None:
    with pytest.raises(InvalidInputError) as refused:
        check_request("q", request_, now=1.0)
    assert refused.value.field == field


def test_a_good_request_and_its_default_burst() -> None:
    quota = check_request("team-a", QuotaRequest(apps="team-a-*", rate_per_s=2.5, max_replicas=0), now=5.0, by="adm")
    assert quota == Quota(name="team-a", apps="team-a-*", rate_per_s=2.5, burst=3, max_replicas=0, created_at=5.0,
                          created_by="adm")
    assert check_request("t", QuotaRequest(token="abc", rate_per_s=0.1), now=0.0).burst == 1


@pytest.mark.parametrize("name", ["", "UPPER", "-lead", "a" * 64, "a/b"])
def test_bad_names(name: str) -> None:
    with pytest.raises(InvalidInputError):
        check_name(name)


def test_matching() -> None:
    apps = Quota(name="a", apps="team-a-*")
    assert covers_app(apps, "team-a-x") and not covers_app(apps, "team-b")
    assert covers_app(Quota(name="e", apps="hello"), "hello")
    token = Quota(name="t", token="abc")
    assert not covers_app(token, "abc")
    assert applies_to_call(token, "anything", "abc") and not applies_to_call(token, "anything", "")
    assert applies_to_call(apps, "team-a-1", "xyz")


def test_the_cli_spellings() -> None:
    assert parse_memory_mb("80GB") == 80 * 1024 and parse_memory_mb("512MB") == 512 and parse_memory_mb("100") == 100
    assert parse_rate("50/s") == 50.0 and parse_rate("600/m") == 10.0 and parse_rate("2") == 2.0
    for bad in ("lots", "0/s", "5/d"):
        with pytest.raises(InvalidInputError):
            parse_rate(bad)
    with pytest.raises(InvalidInputError):
        parse_memory_mb("80 potatoes")
