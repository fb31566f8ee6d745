"""``.ci/system-deps``: what ``make test`` and CI do about the system packages the suite drives (chromium, passt).
Run for real with ``bash``, on a PATH that holds exactly the tools each case needs: a missing package is installed
where apt-get and root allow, else named in one line (never a failure), and CI's ``--require`` fails instead."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from support.paths import REPO

SCRIPT = REPO / ".ci" / "system-deps"
BASH = "/bin/bash"


def tool(folder: Path, name: str, body: str = "exit 0") -> None:
    path = folder / name
    path.write_text(f"#!{BASH}\n{body}\n")
    path.chmod(0o755)


def system_deps(path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([BASH, str(SCRIPT), *args], capture_output=True, text=True, timeout=60,
                          env={"PATH": str(path), "HOME": os.environ.get("HOME", "/")})


def test_with_chromium_and_pasta_it_says_nothing(tmp_path: Path) -> None:
    tool(tmp_path, "chromium")
    tool(tmp_path, "pasta")
    done = system_deps(tmp_path, "--require")
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")


def test_without_apt_get_it_names_what_to_install_and_does_not_fail(tmp_path: Path) -> None:
    tool(tmp_path, "pasta")
    done = system_deps(tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines() == ["system-deps: the tests that need chromium skip; to run them: "
                                        "apt-get install chromium"]


def test_ci_requires_them(tmp_path: Path) -> None:
    done = system_deps(tmp_path, "--require")
    assert done.returncode == 1
    assert "apt-get install chromium passt" in done.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="apt-get installs only as root")
def test_as_root_apt_get_installs_what_is_missing(tmp_path: Path) -> None:
    """apt-get here is a stand-in that records what it is asked and puts the packages' commands on the PATH."""
    asked = tmp_path / "asked"
    tool(tmp_path, "apt-get", f"""echo "$*" >> {asked}
[ "$1" = install ] || exit 0
for package in "$@"; do
    case $package in chromium) command=chromium;; passt) command=pasta;; *) continue;; esac
    printf '#!{BASH}\\n' > {tmp_path}/$command && /bin/chmod +x {tmp_path}/$command
done""")
    done = system_deps(tmp_path, "--require")
    assert done.returncode == 0, done.stderr
    update, install = asked.read_text().splitlines()
    assert update == "update -qq"
    assert install.split()[-2:] == ["chromium", "passt"] and "-y" in install.split()
    assert system_deps(tmp_path, "--require").stderr == ""  # installed: nothing left to do


def test_make_test_runs_it_before_the_suite() -> None:
    planned = subprocess.run(["make", "-n", "test"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert planned.returncode == 0, planned.stderr
    lines = planned.stdout.splitlines()
    deps = next(i for i, line in enumerate(lines) if line.startswith(".ci/system-deps"))
    assert deps < next(i for i, line in enumerate(lines) if "-m pytest" in line)


@pytest.mark.skipif(os.geteuid() != 0, reason="apt-get installs only as root")
def test_when_apt_get_fails_make_test_goes_on_and_ci_stops(tmp_path: Path) -> None:
    tool(tmp_path, "apt-get", "exit 100")  # as it does offline
    tool(tmp_path, "chromium")
    done = system_deps(tmp_path)
    assert done.returncode == 0 and done.stderr.splitlines()[-1].endswith("apt-get install passt"), done.stderr
    assert system_deps(tmp_path, "--require").returncode == 1
