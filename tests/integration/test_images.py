"""Images against the real platform, offline: two versions of a throwaway package are wheels in a local folder
(the node's operator allows it: EMBER_IMAGE_LOCAL_INDEXES); apps pin one or the other.

This test process does not have the package: every push here is one from a machine that lacks what the app's top
level imports, and the manifest is read on the platform inside the app's image."""

from __future__ import annotations

import asyncio
import importlib.util
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import msgspec
import pytest
from support import natsconn
from support.platform import TestPlatform
from support.polling import wait_for
from support.wheels import PACKAGE, write_wheel

import ember
from ember._client import Transport
from ember._deploy import app_view
from ember._errors import InvalidSpecError, NotFoundError
from ember.wire import Deployment, DeployRequest, Manifest, StatusView, encoder
from ember.wire.images import ImageSpec, image_hash

pytestmark = pytest.mark.integration

APP = '''
import os
import sys

import ember
import {package}                      # only the image has it
from {package} import hello

image = (ember.Image(find_links=[{wheels!r}], no_index=True).pip_install("{package}=={version}")
         .env({{"PROBE_GREETING": "hi"}}))
app = ember.App({app!r}, image=image)


@app.function(min_replicas={replicas})
def report() -> dict:
    envs = os.path.dirname(os.path.dirname(os.path.dirname(sys.executable)))  # <state>/envs/<sha>/bin/python
    return {{"version": {package}.__version__, "hello": hello(), "python": sys.executable,
             "greeting": os.environ.get("PROBE_GREETING", ""), "envs_seen": sorted(os.listdir(envs)),
             "bytecode": os.path.isfile({package}.__cached__)}}  # the sandbox cannot write it: the node compiled it


@app.model(min_replicas=1)
class Snap:
    @ember.setup(snap=True)
    def load(self) -> None:
        self.loaded = {package}.__version__
        self.built_by = int(os.environ.get("EMBER_HOST_PID") or os.getpid())

    @ember.method
    def which(self) -> dict:
        return {{"version": self.loaded, "built_by": self.built_by}}
'''


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("wheels")
    write_wheel(folder, version="1.0")
    write_wheel(folder, version="2.0")
    return folder


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory, wheels: Path) -> Iterator[TestPlatform]:
    state = tmp_path_factory.mktemp("ember-images")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("EMBER_IMAGE_LOCAL_INDEXES", str(wheels))
        with TestPlatform(state) as running:
            yield running


@pytest.fixture(scope="module")
def client(node: TestPlatform) -> Iterator[Transport]:
    t = Transport(node.url, token=node.token)
    yield t
    t.close()


def write_app(folder: Path, app: str, version: str, wheels: Path, replicas: int = 1) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "probe_app.py"
    path.write_text(APP.format(package=PACKAGE, wheels=str(wheels), version=version, app=app, replicas=replicas))
    return path


def builds(node: TestPlatform) -> list[str]:
    """One line per environment the node built: ``<sha256> <seconds>``."""
    log = node.state_dir / "node" / "envs" / "builds.log"
    return log.read_text().splitlines() if log.exists() else []


def call(client: Transport, app: str, fn: str) -> dict:
    return client.json("POST", f"/v1/{app}/{fn}", json={})  # type: ignore[no-any-return]


@pytest.mark.timeout(420)  # several pushes, each waited for, on a shared machine
def test_two_apps_pin_two_versions_side_by_side_pushed_from_a_machine_without_the_package(tmp_path, node, client,
                                                                                          wheels):
    assert importlib.util.find_spec(PACKAGE) is None  # this client lacks the package the apps import
    lines: list[str] = []
    one = ember.deploy(write_app(tmp_path / "one", "probe-one", "1.0", wheels, replicas=2), transport=client,
                       timeout_s=240, progress=lambda line, _view: lines.append(line))
    two = ember.deploy(write_app(tmp_path / "two", "probe-two", "2.0", wheels), transport=client, timeout_s=240)
    assert one.version >= 1 and two.version >= 1
    first, second = call(client, "probe-one", "report"), call(client, "probe-two", "report")
    assert first["version"] == "1.0" and first["hello"] == f"{PACKAGE} 1.0"
    assert second["version"] == "2.0" and second["hello"] == f"{PACKAGE} 2.0"
    assert first["python"] != second["python"] and "/envs/" in first["python"]  # each its own environment
    assert first["greeting"] == "hi"  # the image's environment variables
    assert first["bytecode"] and second["bytecode"]  # what the app imports from its image, compiled at the push
    if "replicas run in sandboxes" in (node.log_dir / "agent.log").read_text():  # a sandbox sees its own alone
        other = Path(second["python"]).parents[1].name
        assert other not in first["envs_seen"] and Path(first["python"]).parents[1].name in first["envs_seen"]
    assert any("building" in line for line in lines) and any(f"+ {PACKAGE}==1.0" in line for line in lines)

    # The zygote of each image's snap model is built inside that image, and replicas fork from it.
    assert call(client, "probe-one", "Snap.which")["version"] == "1.0"
    assert call(client, "probe-two", "Snap.which")["version"] == "2.0"
    status = msgspec.json.decode(client.request("GET", "/v1/status", params={"app": "probe-two"}).content,
                                 type=StatusView)
    zygote = wait_for(lambda: next((z for n in status.nodes for z in n.zygotes if z.app == "probe-two"
                                    and z.state == "ready"), None) or _refresh_zygote(client), timeout_s=120,
                      what="the zygote of probe-two, built in its image")
    client.request("POST", "/v1/apps/probe-two/scale", json={"service": "Snap", "min_replicas": 2, "max_replicas": 2})
    forked = wait_for(lambda: [r for s in app_view(client, "probe-two").services for r in s.replicas
                               if r.state == "ready" and r.start is not None and r.start.kind == "zygote"],
                      timeout_s=120, what="a replica forked from the image's zygote")
    assert forked
    answer = wait_for(lambda: (a := call(client, "probe-two", "Snap.which")) and a["built_by"] == zygote.pid and a,
                      timeout_s=60, what="an answer from the forked replica")
    assert answer["version"] == "2.0"


def _refresh_zygote(client: Transport):  # type: ignore[no-untyped-def]
    status = msgspec.json.decode(client.request("GET", "/v1/status", params={"app": "probe-two"}).content,
                                 type=StatusView)
    return next((z for n in status.nodes for z in n.zygotes if z.app == "probe-two" and z.state == "ready"), None)


@pytest.mark.timeout(420)  # several pushes, each waited for, on a shared machine
def test_an_environment_is_built_once_per_node_and_reused_across_versions(tmp_path, node, client, wheels):
    path = write_app(tmp_path / "reuse", "probe-reuse", "2.0", wheels, replicas=2)
    first = ember.deploy(path, transport=client, timeout_s=240)
    sha = next(s.image.sha256 for s in _manifest(node, "probe-reuse").services if s.image)
    built = [line for line in builds(node) if line.startswith(sha)]
    assert len(built) == 1  # two replicas, a zygote and the push's build: one environment, built once
    ready = [r for s in app_view(client, "probe-reuse").services for r in s.replicas if r.state == "ready"]
    assert len(ready) >= 3

    path.write_text(path.read_text() + "\n# a new version, the same lock\n")
    second = ember.deploy(path, transport=client, timeout_s=240)
    assert second.version == first.version + 1
    assert next(s.image.sha256 for s in _manifest(node, "probe-reuse").services if s.image) == sha
    assert [line for line in builds(node) if line.startswith(sha)] == built  # not built again
    client.request("DELETE", "/v1/apps/probe-reuse")


def _manifest(node: TestPlatform, app: str) -> Manifest:
    """The deployed manifest, read as the control plane stores it (the app's view does not carry images)."""

    async def read() -> Manifest:
        nc = await natsconn.connect(node.nats_url)
        try:
            kv = await nc.jetstream().key_value("ember_deployments")
            return msgspec.json.decode((await kv.get(app)).value, type=Deployment).manifest
        finally:
            await nc.close()

    return asyncio.run(read())


def test_ember_push_shows_the_build_with_uvs_log(tmp_path, node, wheels):
    write_wheel(wheels, version="1.5")  # a pin no other test uses: a new lock, a new environment
    path = write_app(tmp_path / "cli", "probe-cli", "1.5", wheels)
    env = {**os.environ, "EMBER_URL": node.url, "EMBER_TOKEN": node.token}
    done = subprocess.run([sys.executable, "-m", "ember.cli", "push", str(path)], capture_output=True, text=True,
                          timeout=240, check=False, env=env)
    assert done.returncode == 0, done.stderr
    log = done.stderr
    assert "building 1 image(s) on node" in log and "resolving 1 requirement(s)" in log
    assert "| locked as " in log and f"+ {PACKAGE}==1.5" in log  # uv's own lines
    assert "importing probe_app inside its image" in log and "probe-cli v1 is deployed" in done.stdout


def test_another_node_builds_the_same_lock_itself_for_its_replicas(tmp_path, node, client, wheels):
    ember.deploy(write_app(tmp_path / "spread", "probe-spread", "2.0", wheels), transport=client, timeout_s=240)
    sha = next(s.image.sha256 for s in _manifest(node, "probe-spread").services if s.image)
    node.add_agent("second")
    client.request("POST", "/v1/apps/probe-spread/scale", json={"service": "report", "min_replicas": 3,
                                                                "max_replicas": 3})
    wait_for(lambda: [r for s in app_view(client, "probe-spread").services for r in s.replicas
                      if r.node_id == "second" and r.state == "ready"], timeout_s=180,
             what="a replica on the second node")
    built = node.state_dir / "node-second" / "envs" / "builds.log"
    assert [line.split()[0] for line in built.read_text().splitlines()].count(sha) == 1  # built there, once
    assert {call(client, "probe-spread", "report")["version"] for _ in range(12)} == {"2.0"}
    client.request("DELETE", "/v1/apps/probe-spread")


@pytest.mark.timeout(420)  # several pushes, each waited for, on a shared machine
def test_an_image_that_did_not_change_keeps_its_lock_until_relocked(tmp_path, node, client, wheels):
    drift = wheels / "drift"  # inside the folder the node allows
    write_wheel(drift, version="1.0")
    path = tmp_path / "drift" / "drift_app.py"
    path.parent.mkdir()
    path.write_text(f"import ember\nimport {PACKAGE}\n"
                    f"image = ember.Image(find_links=[{str(drift)!r}], no_index=True).pip_install('{PACKAGE}>=1.0')\n"
                    "app = ember.App('probe-drift', image=image)\n\n@app.function()\n"
                    f"def version() -> str:\n    return {PACKAGE}.__version__\n")
    ember.deploy(path, transport=client, timeout_s=240)
    assert call(client, "probe-drift", "version") == "1.0"
    write_wheel(drift, version="3.0")  # a newer release appears on the index
    path.write_text(path.read_text() + "# a new version of the code, the same image\n")
    lines: list[str] = []
    ember.deploy(path, transport=client, timeout_s=240, progress=lambda line, _view: lines.append(line))
    assert any("the image did not change: keeping the running version's lock" in line for line in lines)
    assert call(client, "probe-drift", "version") == "1.0"  # what ran before, exactly
    ember.deploy(path, transport=client, timeout_s=240, relock=True)
    assert wait_for(lambda: call(client, "probe-drift", "version") == "3.0", timeout_s=60, what="the relocked image")
    client.request("DELETE", "/v1/apps/probe-drift")


def test_a_missing_package_fails_the_push_naming_it(tmp_path, node, client, wheels):
    path = write_app(tmp_path / "missing", "probe-missing", "3.0", wheels)
    with pytest.raises(InvalidSpecError) as caught:
        ember.deploy(path, transport=client, timeout_s=120)
    assert f"{PACKAGE}==3.0" in str(caught.value) and "cannot resolve" in str(caught.value)
    with pytest.raises(NotFoundError):
        app_view(client, "probe-missing")  # nothing was deployed


def test_an_app_without_image_that_imports_a_missing_package_is_refused_clearly(tmp_path, client):
    path = tmp_path / "bare.py"
    path.write_text(f"import ember\nimport {PACKAGE}\napp = ember.App('probe-bare')\n\n"
                    "@app.function()\ndef f() -> int:\n    return 1\n")
    with pytest.raises(InvalidSpecError, match=f"needs {PACKAGE}.*no image"):
        ember.deploy(path, transport=client, timeout_s=60)


def test_a_pin_that_would_break_embers_runtime_fails_at_push(tmp_path, client, wheels):
    path = tmp_path / "clash.py"
    path.write_text(f"import ember\nimage = ember.Image(find_links=[{str(wheels)!r}], no_index=True)"
                    ".pip_install('msgspec<0.10')\napp = ember.App('probe-clash', image=image)\n\n"
                    "@app.function()\ndef f() -> int:\n    return 1\n")
    with pytest.raises(InvalidSpecError, match="msgspec"):
        ember.deploy(path, transport=client, timeout_s=60)


# ---- attacks on the routes and the node


def _upload(client: Transport, tmp_path: Path) -> str:
    from ember._bundle import build_bundle

    (tmp_path / "b").mkdir(exist_ok=True)
    (tmp_path / "b" / "x.py").write_text("import ember\napp = ember.App('probe-x')\n")
    bundle = build_bundle(tmp_path / "b")
    client.request("PUT", f"/v1/bundles/{bundle.sha256}", content=bundle.data,
                   headers={"content-type": "application/gzip"})
    return bundle.sha256


def _post_build(http_client, sha: str, image: dict, **extra):  # type: ignore[no-untyped-def]
    declared = {"app": "probe-x", "module": "x", "services": [  # as the pushing machine read it
        {"name": "f", "kind": "function", "functions": [{"name": "f", "attr": "f", "input_mode": "none"}],
         "image": image}]}
    return http_client.post("/v1/apps/probe-x/builds", json={"bundle_sha256": sha, "module": "x", "images": [image],
                                                             "declared": declared, **extra})


@pytest.fixture(scope="module")
def http(node: TestPlatform):  # type: ignore[no-untyped-def]
    import httpx

    with httpx.Client(base_url=node.url, headers={"Authorization": f"Bearer {node.token}"}, timeout=30) as c:
        yield c


@pytest.mark.parametrize(("image", "field"), [
    ({"packages": ["emberprobe @ file:///etc/passwd"]}, "$.images[0].packages[0]"),
    ({"packages": ["../../outside"]}, "$.images[0].packages[0]"),
    ({"packages": ["-e /"]}, "$.images[0].packages[0]"),
    ({"packages": ["x --index-url=https://evil"]}, "$.images[0].packages[0]"),
    ({"packages": ["ember==0.1"]}, "$.images[0].packages[0]"),
    ({"env": {"A=B": "1"}}, "$.images[0].env"),
    ({"env": {"A\u0000B": "1"}}, "$.images[0].env"),
    ({"env": {"HF_TOKEN": "hf_abc"}}, "$.images[0].env"),
    ({"env": {"LD_PRELOAD": "/tmp/x.so"}}, "$.images[0].env"),
    ({"find_links": ["file:///etc"]}, "$.images[0].find_links[0]"),
    ({"find_links": ["/srv/../etc"]}, "$.images[0].find_links[0]"),
    ({"index_url": "ftp://mirror"}, "$.images[0].index_url"),
    ({"index_url": "http://169.254.169.254/latest/meta-data/"}, "$.images[0].index_url"),  # the node's credentials
    ({"python": "../3.11"}, "$.images[0].python"),
    ({"lock": "x==1", "sha256": "../../../etc"}, "$.images[0].lock"),
])
def test_hostile_images_are_refused_naming_the_field(tmp_path, client, http, image, field):
    sha = _upload(client, tmp_path)
    response = _post_build(http, sha, image)
    assert response.status_code == 422, response.text
    assert response.json()["error"]["field"] == field


def test_a_forged_lock_or_hash_is_refused_at_deploy(tmp_path, client, http):
    sha = _upload(client, tmp_path)
    service = {"name": "f", "kind": "function",
               "functions": [{"name": "f", "attr": "f", "input_mode": "none"}]}
    forged = [
        ({"lock": "emberprobe==1.0\n", "sha256": "../../etc/passwd"}, "sha256"),
        ({"lock": "emberprobe==1.0\n", "sha256": "0" * 64}, "sha256"),
        ({"lock": "emberprobe @ file:///etc/passwd\n", "sha256": "0" * 64}, "lock"),
        ({"packages": ["emberprobe"]}, "lock"),  # not locked at all
    ]
    for image, field in forged:
        manifest = {"app": "probe-x", "module": "x", "services": [{**service, "image": image}]}
        response = http.post("/v1/apps/probe-x/deployments", json={"bundle_sha256": sha, "manifest": manifest})
        assert response.status_code == 422, (image, response.text)
        assert response.json()["error"]["field"].startswith("$.manifest.services[0].image"), response.text
        assert response.json()["error"]["field"].endswith(field), response.text


def test_a_local_folder_the_operator_did_not_allow_is_refused_by_the_node(tmp_path, client, http):
    sha = _upload(client, tmp_path)
    response = _post_build(http, sha, {"packages": ["emberprobe"], "find_links": [str(tmp_path)], "no_index": True})
    assert response.status_code == 202, response.text
    build_id = response.json()["build_id"]
    view = wait_for(lambda: (v := http.get(f"/v1/apps/probe-x/builds/{build_id}").json())["state"] == "failed" and v,
                    timeout_s=60, what="the build to fail")
    assert "EMBER_IMAGE_LOCAL_INDEXES" in view["error"]


def test_build_routes_refuse_bad_ids_and_other_apps_builds(tmp_path, client, http):
    for bad in ("..%2f..%2fetc", "0" * 31, "Z" * 32):
        assert http.get(f"/v1/apps/probe-x/builds/{bad}").status_code in (400, 404)
    assert http.get(f"/v1/apps/probe-x/builds/{'0' * 32}?since=-1").status_code == 400
    sha = _upload(client, tmp_path)
    started = _post_build(http, sha, {"packages": ["emberprobe"], "find_links": [str(tmp_path)], "no_index": True})
    build_id = started.json()["build_id"]
    assert http.get(f"/v1/apps/other-app/builds/{build_id}").status_code == 404  # a build is its app's alone
    assert http.post("/v1/apps/probe-x/builds", content=b"x" * (2 * 1024 * 1024)).status_code == 413
    assert http.post("/v1/apps/probe-x/builds", json={"bundle_sha256": "0" * 64, "module": "x",
                                                      "images": [{}]}).status_code == 404  # never uploaded


@pytest.mark.timeout(420)  # two pushes, each waited for, on a shared machine
def test_an_image_locked_for_another_tenants_app_is_deployed_only_after_a_build_of_ones_own(tmp_path, node, http,
                                                                                            wheels):
    """A lock is no proof of ownership: ``tenant-*`` naming the image a build locked for ``team-b-*``'s app is
    answered exactly as for a lock no build made; its own push of the same image locks it for its app, and the node
    reuses the environment it built (once)."""
    def transport(apps: list[str]) -> Transport:
        made = http.post("/v1/tokens", json={"scopes": ["deploy"], "apps": apps, "name": f"img-{apps[0].rstrip('*-')}"})
        assert made.status_code == 201, made.text
        return Transport(node.url, token=made.json()["token"])

    team_b, tenant = transport(["team-b-*"]), transport(["tenant-*"])
    try:
        ember.deploy(write_app(tmp_path / "theirs", "team-b-img", "1.0", wheels, replicas=0), transport=team_b,
                     wait=False)
        theirs = _manifest(node, "team-b-img")
        image = next(s.image for s in theirs.services if s.image)
        sha = _upload(tenant, tmp_path)
        never = msgspec.structs.replace(image, lock=image.lock + "# never built\n")
        never = msgspec.structs.replace(never, sha256=image_hash(never))

        def deploy_with(locked: ImageSpec) -> httpx.Response:
            manifest = msgspec.structs.replace(theirs, app="tenant-img", services=[
                msgspec.structs.replace(s, image=locked if s.image else None) for s in theirs.services])
            return httpx.post(f"{node.url}/v1/apps/tenant-img/deployments", timeout=30,
                              headers={"Authorization": f"Bearer {tenant.token}"},
                              content=encoder.encode(DeployRequest(bundle_sha256=sha, manifest=manifest)))

        stolen, unknown = deploy_with(image), deploy_with(never)
        assert stolen.status_code == unknown.status_code == 404, stolen.text
        assert stolen.json()["error"] == {**unknown.json()["error"], "message": unknown.json()["error"][
            "message"].replace(never.sha256[:12], image.sha256[:12])}
        assert stolen.json()["error"]["field"].endswith(".image.sha256")

        ember.deploy(write_app(tmp_path / "mine", "tenant-img", "1.0", wheels, replicas=0), transport=tenant,
                     wait=False)
        assert next(s.image for s in _manifest(node, "tenant-img").services if s.image).sha256 == image.sha256
        assert len([line for line in builds(node) if line.startswith(image.sha256)]) == 1  # built once
        assert deploy_with(image).status_code == 201
    finally:
        for app in ("team-b-img", "tenant-img"):
            http.delete(f"/v1/apps/{app}")
        team_b.close()
        tenant.close()
