"""The Dockerfile, read as Docker reads it (no engine in CI to build it): two stages, and an image that runs as
a non-root user under tini, has a health check, and carries no compiler; .dockerignore sends what it copies
and nothing of a developer's state."""

from __future__ import annotations

import fnmatch
import json
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from support.paths import REPO

BUILD_TOOLS = re.compile(r"^(build-essential|gcc(-\d+)?|g\+\+(-\d+)?|clang|make|cmake|cargo|rustc|.*-dev)$")


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def all(self, keyword: str) -> list[str]:
        return [args for kw, args in self.instructions if kw == keyword]


def parse(text: str) -> tuple[dict[str, str], list[Stage]]:
    """Global ARGs and the stages, each a list of (INSTRUCTION, arguments), continuation lines joined."""
    lines: list[str] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if pending and line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        lines.append(pending + line)
        pending = ""
    args: dict[str, str] = {}
    stages: list[Stage] = []
    for line in lines:
        keyword, _, rest = line.partition(" ")
        keyword = keyword.upper()
        if keyword == "FROM":
            words = rest.split()
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
            stages.append(Stage(words[0], name))
        elif not stages:
            assert keyword == "ARG", f"{keyword} before the first FROM"
            key, _, value = rest.partition("=")
            args[key] = value
        else:
            stages[-1].instructions.append((keyword, rest.strip()))
    return args, stages


def apt_packages(run: str) -> list[str]:
    """The packages every ``apt-get install`` in one RUN instruction names."""
    found: list[str] = []
    for command in re.split(r"&&|;", run):
        words = shlex.split(command)
        if words[:1] == ["apt-get"] and "install" in words:
            found += [w for w in words[words.index("install") + 1:] if not w.startswith("-")]
    return found


@pytest.fixture
def dockerfile() -> tuple[dict[str, str], list[Stage]]:
    return parse((REPO / "Dockerfile").read_text())


def test_two_stages_on_one_base(dockerfile: tuple[dict[str, str], list[Stage]]) -> None:
    args, stages = dockerfile
    assert [s.name for s in stages] == ["build", None]
    assert {s.base for s in stages} == {"${BASE_IMAGE}"} and args["BASE_IMAGE"].startswith("nvidia/cuda:")


def test_the_image_carries_no_build_tools(dockerfile: tuple[dict[str, str], list[Stage]]) -> None:
    _, (build, final) = dockerfile
    built_with = [p for run in build.all("RUN") for p in apt_packages(run)]
    assert "build-essential" in built_with  # they are in the build stage, where they belong
    installed = [p for run in final.all("RUN") for p in apt_packages(run)]
    assert "tini" in installed and "python3.11" in installed
    assert [p for p in installed if BUILD_TOOLS.match(p)] == []
    assert not any("pip install" in run for run in final.all("RUN"))  # nothing is built in the image
    copies = final.all("COPY")
    assert all(c.startswith("--from=build ") or c.startswith("deploy/docker/") for c in copies), copies


def test_a_non_root_user_under_tini(dockerfile: tuple[dict[str, str], list[Stage]]) -> None:
    _, (_, final) = dockerfile
    user = final.all("USER")[-1].split(":")[0]
    assert user not in ("root", "0") and user.isdigit()  # numeric: Kubernetes' runAsNonRoot can check it
    assert any(f"--uid {user}" in run for run in final.all("RUN"))
    entrypoint = json.loads(final.all("ENTRYPOINT")[-1])  # the exec form: tini is pid 1, not a shell
    assert entrypoint == ["/usr/bin/tini", "--"]
    command = json.loads(final.all("CMD")[-1])
    assert command[:3] == ["python", "-m", "ember_platform"]


def test_a_health_check_that_runs_the_shipped_script(dockerfile: tuple[dict[str, str], list[Stage]]) -> None:
    _, (_, final) = dockerfile
    (check,) = final.all("HEALTHCHECK")
    options, _, command = check.partition(" CMD ")
    assert json.loads(command) == ["python", "/opt/ember/healthcheck.py"]
    assert "--timeout=" in options and "--start-period=" in options
    assert "deploy/docker/healthcheck.py /opt/ember/healthcheck.py" in final.all("COPY")
    assert (REPO / "deploy" / "docker" / "healthcheck.py").is_file()


def test_a_build_tool_in_the_image_would_be_caught() -> None:
    bad = (REPO / "Dockerfile").read_text().replace("python3.11 tini ca-certificates", "python3.11 tini gcc")
    _, (_, final) = parse(bad)
    assert [p for run in final.all("RUN") for p in apt_packages(run) if BUILD_TOOLS.match(p)] == ["gcc"]


def _matches(pattern: str, path: str) -> bool:
    """Docker's rule: the pattern matches the path or a folder above it; ``**/`` matches at any depth."""
    parts = path.split("/")
    if pattern.startswith("**/"):
        spans = ["/".join(parts[i:j]) for i in range(len(parts)) for j in range(i + 1, len(parts) + 1)]
        return any(fnmatch.fnmatch(span, pattern[3:]) for span in spans)
    return any(fnmatch.fnmatch("/".join(parts[:i]), pattern) for i in range(1, len(parts) + 1))


def _sent(path: str, patterns: list[str]) -> bool:
    """Whether ``docker build`` sends ``path``: the last pattern that matches it decides."""
    sent = True
    for pattern in patterns:
        if _matches(pattern.lstrip("!").rstrip("/"), path):
            sent = pattern.startswith("!")
    return sent


def test_dockerignore_sends_what_the_dockerfile_copies_and_no_state(
        dockerfile: tuple[dict[str, str], list[Stage]]) -> None:
    patterns = [line.strip() for line in (REPO / ".dockerignore").read_text().splitlines()
                if line.strip() and not line.startswith("#")]
    _, stages = dockerfile
    sources = [word for stage in stages for c in stage.all("COPY") if not c.startswith("--from")
               for word in c.split()[:-1]]
    for source in sources:
        sample = source if "." in Path(source).name else f"{source}/x.py"
        assert _sent(sample, patterns), source
    for private in (".git/config", ".venv/bin/python", ".ember/dev/token", "sdk/ember/__pycache__/x.pyc",
                    "tests/unit/x.py", "examples/hello/hello.py", ".ember/dev/nats-auth/platform.nk"):
        assert not _sent(private, patterns), private
