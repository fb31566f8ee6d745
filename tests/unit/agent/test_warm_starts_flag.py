"""The node agent's counts: ``--warm-starts`` (and ``EMBER_WARM_STARTS``), a whole number from 0 to 64, and
``--build-memory-mb`` (``EMBER_BUILD_MEMORY_MB``), MiB from 0 to 1,048,576; anything else refused with argparse's
error naming the option, before the agent connects anywhere."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

OPTIONS = [("--warm-starts", "EMBER_WARM_STARTS", "65"), ("--build-memory-mb", "EMBER_BUILD_MEMORY_MB", "1048577")]


@pytest.mark.parametrize(("option", "over"), [(option, over) for option, _, over in OPTIONS])
@pytest.mark.parametrize("value", ["-1", "over", "two", "1.5", "", "1e3", "9" * 40, "\u0663"])
def test_a_value_that_is_not_a_count_is_refused(option, over, value, tmp_path):
    done = subprocess.run([sys.executable, "-m", "ember_runtime", "--state-dir", str(tmp_path), option,
                           over if value == "over" else value, "--insecure-no-auth", "--insecure-no-sandbox",
                           "--nats", "nats://127.0.0.1:1"], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2 and option in done.stderr, done.stderr


@pytest.mark.parametrize(("option", "variable"), [(option, variable) for option, variable, _ in OPTIONS])
def test_the_environment_variable_is_checked_too(option, variable, tmp_path):
    done = subprocess.run([sys.executable, "-m", "ember_runtime", "--state-dir", str(tmp_path), "--insecure-no-auth",
                           "--insecure-no-sandbox", "--nats", "nats://127.0.0.1:1"], capture_output=True, text=True,
                          timeout=60, check=False, env={**os.environ, variable: "lots"})
    assert done.returncode == 2 and option in done.stderr, done.stderr
