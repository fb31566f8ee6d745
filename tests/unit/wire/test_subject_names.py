"""NATS subject names are built in one place, and a name can never add or remove a subject level."""

import re
from collections.abc import Callable

import pytest

from ember.wire import subjects

_TOKEN = re.compile(r"[A-Za-z0-9_-]+")


def test_invoke() -> None:
    assert subjects.invoke("hello", "greet", 3) == "ember.invoke.default.hello.greet.v3"
    assert subjects.invoke("hello", "greet", 3, tenant="acme") == "ember.invoke.acme.hello.greet.v3"


def test_method_names_are_one_token() -> None:
    subject = subjects.invoke("digits", "Classifier.predict", 1)
    assert subject == "ember.invoke.default.digits.Classifier-predict.v1"
    assert subject.split(".") == ["ember", "invoke", "default", "digits", "Classifier-predict", "v1"]
    assert subjects.calls("digits", "Classifier.predict") == "ember.calls.default.digits.Classifier-predict"
    assert subjects.stats("digits", "Classifier.predict") == "ember.stats.digits.Classifier-predict"


def test_other_subjects() -> None:
    assert subjects.replica_invoke("r-1_a") == "ember.replica.r-1_a.invoke"
    assert subjects.replica_group("digits", "Classifier", 2) == "digits.Classifier.v2"
    assert subjects.logs("digits", "Classifier", "gpu-01") == "ember.logs.digits.Classifier.gpu-01"
    assert subjects.node_logs("gpu-01") == "ember.logs.*.*.gpu-01"
    assert subjects.calls("hello", "greet", tenant="t1") == "ember.calls.t1.hello.greet"
    assert subjects.stats("hello", "greet") == "ember.stats.hello.greet"


def test_logs_wildcard_covers_every_log_subject() -> None:
    assert subjects.LOGS_ALL == "ember.logs.>"
    assert subjects.logs("a", "b", "n").startswith(subjects.LOGS_ALL[:-1])


@pytest.mark.parametrize("name", [subjects.DEPLOYMENTS_BUCKET, subjects.REPLICAS_BUCKET, subjects.NODES_BUCKET,
                                  subjects.BUNDLES_STORE])
def test_bucket_names_are_valid(name: str) -> None:
    assert _TOKEN.fullmatch(name)


BAD_TOKENS = ["", "a.b", "a b", ">", "*", "a>", "a*b", "a\tb", "ä", "a/b"]
BUILDERS: dict[str, Callable[[str], str]] = {
    "invoke-app": lambda t: subjects.invoke(t, "f", 1),
    "invoke-tenant": lambda t: subjects.invoke("app", "f", 1, tenant=t),
    "replica": subjects.replica_invoke,
    "group-app": lambda t: subjects.replica_group(t, "svc", 1),
    "group-service": lambda t: subjects.replica_group("app", t, 1),
    "logs-app": lambda t: subjects.logs(t, "svc", "n"),
    "logs-service": lambda t: subjects.logs("app", t, "n"),
    "logs-node": lambda t: subjects.logs("app", "svc", t),
    "calls-app": lambda t: subjects.calls(t, "f"),
    "calls-tenant": lambda t: subjects.calls("app", "f", tenant=t),
    "stats-app": lambda t: subjects.stats(t, "f"),
}


@pytest.mark.parametrize("token", BAD_TOKENS)
@pytest.mark.parametrize("build", BUILDERS.values(), ids=BUILDERS.keys())
def test_invalid_tokens_are_rejected(build: Callable[[str], str], token: str) -> None:
    with pytest.raises(ValueError, match="may hold only letters, digits, '-' and '_'"):
        build(token)


FUNCTION_BUILDERS: dict[str, Callable[[str], str]] = {
    "invoke": lambda f: subjects.invoke("app", f, 1),
    "calls": lambda f: subjects.calls("app", f),
    "stats": lambda f: subjects.stats("app", f),
}


@pytest.mark.parametrize("name", ["", "a b", ">", "*", "Cls.>", "Cls..m", ".m", "m.", "Cls.m b"])
@pytest.mark.parametrize("build", FUNCTION_BUILDERS.values(), ids=FUNCTION_BUILDERS.keys())
def test_invalid_function_names_are_rejected(build: Callable[[str], str], name: str) -> None:
    with pytest.raises(ValueError, match="function name"):
        build(name)


def test_trailing_newline_is_rejected() -> None:
    accepted = []
    for name, build in {**BUILDERS, **FUNCTION_BUILDERS}.items():
        try:
            build("app\n")
        except ValueError:
            continue
        accepted.append(name)
    assert accepted == []


def test_function_tokens_are_unambiguous() -> None:
    assert subjects.invoke("app", "Classifier.predict", 1) != subjects.invoke("app", "Classifier__predict", 1)
