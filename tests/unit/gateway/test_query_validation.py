"""The gateway's checks of query values: a logs window and a function's name."""

from __future__ import annotations

import pytest

from ember._errors import BadRequestError
from ember_platform.gateway.apps import MAX_LOG_LINES, log_window
from ember_platform.gateway.calls import check_function_name


@pytest.mark.parametrize(("query", "expected"), [
    ({}, (0.0, 200)),
    ({"since": "1700000000.5", "limit": "10"}, (1700000000.5, 10)),
    ({"since": "0", "limit": "1"}, (0.0, 1)),
    ({"limit": "007"}, (0.0, 7)),
    ({"limit": "99999"}, (0.0, MAX_LOG_LINES)),
    ({"limit": "9" * 5000}, (0.0, MAX_LOG_LINES)),  # longer than int() takes: clamps, no error
])
def test_a_log_window(query, expected):
    assert log_window(query) == expected


@pytest.mark.parametrize(("field", "value"), [
    ("since", "nan"), ("since", "NaN"), ("since", "inf"), ("since", "-inf"), ("since", "1e400"), ("since", "-1"),
    ("since", "abc"), ("since", ""),
    ("limit", "0"), ("limit", "000"), ("limit", "-1"), ("limit", "1.5"), ("limit", "nan"), ("limit", "abc"),
    ("limit", ""), ("limit", "1_0"), ("limit", "+5"), ("limit", "\u00b2"), ("limit", "\u0663"),
])
def test_a_bad_log_window_is_400_naming_the_field(field, value):
    with pytest.raises(BadRequestError) as caught:
        log_window({field: value})
    assert caught.value.field == field


@pytest.mark.parametrize("name", ["greet", "_f", "Classifier.predict", "a" * 128])
def test_a_function_name(name):
    assert check_function_name(name, "function") == name


@pytest.mark.parametrize("name", ["", "x.>", "*", ">", "a b", "x..y", "1x", "a.b.c", ".a", "a.", "\xe9", "a-b",
                                  "a" * 129, "x" * 5000])
def test_a_malformed_function_name_is_400(name):
    with pytest.raises(BadRequestError) as caught:
        check_function_name(name, "function")
    assert caught.value.field == "function"
    assert len(str(caught.value)) < 300
