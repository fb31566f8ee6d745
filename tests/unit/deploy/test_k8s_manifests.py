"""deploy/kubernetes/: every object validates against the Kubernetes schemas (kubernetes-validate, which ships
them: no network), every file passes yamllint, and the manifests agree with the code they run: real CLI flags,
probes on open routes, the Secrets they mount, the least privileges each part needs."""

from __future__ import annotations

import argparse
import copy
import runpy
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from k8s_docs import K8S, KUBERNETES_VERSION, container, documents, find, manifest_files, pod_spec
from support.paths import REPO
from yamllint import config as yamllint_config
from yamllint import linter

from ember.wire.natscreds import CredentialsError
from ember_platform.auth.bootstrap import read_token_file
from ember_platform.gateway import asgi, health
from ember_platform.natsauth import keys
from ember_platform.secrets.key import read_key, write_key

OBJECTS = [(path, doc) for path in manifest_files() for doc in documents(path)]


def _id(item: tuple[Path, dict[str, Any]]) -> str:
    return f"{item[0].name}:{item[1]['kind']}/{item[1]['metadata']['name']}"


@pytest.mark.parametrize("item", OBJECTS, ids=[_id(o) for o in OBJECTS])
def test_every_object_validates_against_the_kubernetes_schema(item: tuple[Path, dict[str, Any]]) -> None:
    _, doc = item
    kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)  # the oldest release supported
    kubernetes_validate.validate(doc, kubernetes_validate.utils.latest_version(), strict=True)  # and the newest


def test_the_schemas_are_strict_and_shipped_with_the_package() -> None:
    assert KUBERNETES_VERSION[:4] in {v[:4] for v in kubernetes_validate.utils.all_versions()}
    bad = copy.deepcopy(find("DaemonSet", "ember-agent"))
    container(bad, "agent")  # exists
    pod_spec(bad)["containers"][0]["securityContext"]["procMonut"] = "Unmasked"  # a typo is an unknown field
    with pytest.raises(kubernetes_validate.ValidationError, match="procMonut"):
        kubernetes_validate.validate(bad, KUBERNETES_VERSION, strict=True)


def test_every_file_under_deploy_passes_yamllint() -> None:
    conf = yamllint_config.YamlLintConfig(file=str(REPO / ".yamllint"))
    files = sorted((REPO / "deploy").rglob("*.yaml"))
    assert len(files) >= 5
    problems = [f"{path.relative_to(REPO)}:{p.line}: {p.message}" for path in files
                for p in linter.run(path.read_text(), conf, str(path)) if p.level == "error"]
    assert problems == []
    broken = "a: 1\na: 2\n"  # and it does find errors
    assert [p.rule for p in linter.run(broken, conf)] == ["key-duplicates"]


def test_kustomization_lists_the_manifests_and_never_the_secrets() -> None:
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    listed = set(kustomization["resources"])
    assert listed == {p.name for p in manifest_files()} - {"secrets.example.yaml"}
    assert all((K8S / name).is_file() for name in listed)
    kinds = {doc["kind"] for name in listed for doc in documents(K8S / name)}
    assert "Secret" not in kinds  # `kubectl apply -k` must never replace the operator's Secrets
    images = {c["image"] for _, doc in OBJECTS if "template" in doc.get("spec", {})
              for c in [*pod_spec(doc).get("initContainers", []), *pod_spec(doc)["containers"]]}
    assert images == {image["name"] for image in kustomization["images"]}  # `kustomize edit set image` sets all


def test_objects_live_in_the_namespaces_the_manifests_create() -> None:
    created = {doc["metadata"]["name"] for doc in documents(K8S / "namespaces.yaml")}
    used = {doc["metadata"]["namespace"] for _, doc in OBJECTS if doc["kind"] != "Namespace"}
    assert used == created == {"ember", "ember-nodes"}


def _secret_refs(workload: dict[str, Any]) -> set[tuple[str, str]]:
    """(secret, key) for every Secret key a workload mounts; "*" where it mounts them all."""
    refs: set[tuple[str, str]] = set()
    for volume in pod_spec(workload)["volumes"]:
        sources = [s["secret"] for s in volume.get("projected", {}).get("sources", []) if "secret" in s]
        if "secret" in volume:
            sources.append({"name": volume["secret"]["secretName"], **volume["secret"]})
        for source in sources:
            items = source.get("items")
            refs |= {(source["name"], item["key"]) for item in items} if items else {(source["name"], "*")}
    return refs


def test_every_mounted_secret_is_described_with_its_keys() -> None:
    described = {(doc["metadata"]["namespace"], doc["metadata"]["name"]): set(doc["stringData"])
                 for doc in documents(K8S / "secrets.example.yaml")}
    for workload in (find("Deployment", "ember-platform"), find("DaemonSet", "ember-agent")):
        namespace = workload["metadata"]["namespace"]
        for name, key in _secret_refs(workload):
            assert (namespace, name) in described, f"{name} is mounted but not in secrets.example.yaml"
            assert key == "*" or key in described[(namespace, name)]
    assert all(described.values())
    values = [v for doc in documents(K8S / "secrets.example.yaml") for v in doc["stringData"].values()]
    assert all(v.startswith("REPLACE") for v in values)  # placeholders only, never a value that could be real


class _Parsed(Exception):
    def __init__(self, args: argparse.Namespace, flags: set[str]) -> None:
        self.args_ = args
        self.flags = flags


def _parse_with_the_real_cli(module: str, args: list[str], monkeypatch: pytest.MonkeyPatch) -> argparse.Namespace:
    """Run ``python -m module args`` up to its argument parsing, with its own parser: an unknown flag or a bad
    value exits 2 as it would in the pod. Each flag must be spelled in full (argparse would take a prefix)."""
    real = argparse.ArgumentParser.parse_args

    def parse_then_stop(self: argparse.ArgumentParser, *a: Any, **kw: Any) -> Any:
        raise _Parsed(real(self, *a, **kw), set(self._option_string_actions))

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_then_stop)
    monkeypatch.setattr(sys, "argv", [module, *args])
    with pytest.raises(_Parsed) as parsed:
        runpy.run_module(module, run_name="__main__", alter_sys=False)
    abbreviated = {a.split("=")[0] for a in args if a.startswith("--")} - parsed.value.flags
    assert not abbreviated, f"not {module}'s flags as written: {abbreviated}"
    return parsed.value.args_


def _module_args(c: dict[str, Any]) -> tuple[str, list[str]]:
    argv = [*c.get("command", []), *c["args"]]
    assert argv[:2] == ["python", "-m"], "the image's tini entry point stays: containers set args, not command"
    assert "command" not in c
    return argv[2], argv[3:]


def test_control_plane_args_are_real_flags_with_safe_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    module, args = _module_args(container(find("Deployment", "ember-platform"), "platform"))
    assert module == "ember_platform"
    ns = _parse_with_the_real_cli(module, args, monkeypatch)
    assert ns.host == "0.0.0.0" and ns.port == 8700
    assert not ns.insecure_no_auth
    assert str(ns.nats_auth_dir).startswith("/run/ember/")
    assert str(ns.bootstrap_token_file).startswith("/run/ember/") and str(ns.secrets_key_file).startswith("/run/")


def test_a_made_up_or_shortened_flag_is_refused_by_that_check(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(SystemExit) as exited:
        _parse_with_the_real_cli("ember_platform", ["--listen", "0.0.0.0"], monkeypatch)
    assert exited.value.code == 2
    with pytest.raises(AssertionError, match="--nats-auth"):
        _parse_with_the_real_cli("ember_platform", ["--nats-auth", "/x"], monkeypatch)


def test_node_agent_args_are_real_flags_and_require_the_sandbox(monkeypatch: pytest.MonkeyPatch) -> None:
    module, args = _module_args(container(find("DaemonSet", "ember-agent"), "agent"))
    assert module == "ember_runtime"
    ns = _parse_with_the_real_cli(module, args, monkeypatch)
    assert ns.sandbox == "required"  # never --insecure-no-sandbox or --sandbox-if-possible in production
    assert ns.node_id is None  # the node id is the one its credentials name
    assert str(ns.nats_creds) == "/run/ember/node.creds" and str(ns.state_dir) == "/var/lib/ember"


def _copied_files(init: dict[str, Any]) -> set[str]:
    script = init["command"][-1]
    return {line.split()[-1] for line in script.splitlines() if line.strip().startswith("install ")}


def test_the_files_the_flags_name_are_the_ones_the_init_step_writes() -> None:
    deployment = find("Deployment", "ember-platform")
    _, args = _module_args(container(deployment, "platform"))
    written = _copied_files(container(deployment, "credentials"))
    named = {args[i + 1] for i, a in enumerate(args) if a in ("--bootstrap-token-file", "--secrets-key-file")}
    assert named <= written
    assert "/run/ember/nats-auth/" in written  # --nats-auth-dir: platform.nk and callout.json
    agent = find("DaemonSet", "ember-agent")
    assert "/run/ember/node.creds" in _copied_files(container(agent, "prepare"))


def test_probes_ask_open_routes_that_exist_on_the_served_port() -> None:
    deployment = find("Deployment", "ember-platform")
    c = container(deployment, "platform")
    routes = {(r.path, method): r.endpoint for r in asgi.ROUTES for method in (r.methods or ())}
    probes = {kind: c[kind]["httpGet"] for kind in ("startupProbe", "livenessProbe", "readinessProbe")}
    assert probes["readinessProbe"]["path"] == "/readyz" and probes["livenessProbe"]["path"] == "/healthz"
    for probe in probes.values():
        endpoint = routes[(probe["path"], "GET")]
        assert endpoint in (health.healthz, health.readyz)  # unguarded: the kubelet sends no token
        port = next(p for p in c["ports"] if p["name"] == probe["port"])
        _, args = _module_args(c)
        assert str(port["containerPort"]) == args[args.index("--port") + 1]
    service = find("Service", "ember-platform")
    assert service["spec"]["ports"][0]["targetPort"] == "http"
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]


def test_control_plane_runs_two_replicas_that_never_all_go_at_once() -> None:
    deployment = find("Deployment", "ember-platform")
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    assert find("PodDisruptionBudget", "ember-platform")["spec"]["minAvailable"] == 1
    env = {e["name"]: e["value"] for e in container(deployment, "platform")["env"]}
    assert env["EMBER_JS_REPLICAS"] == "3"  # three copies of every stream on the three-server cluster


def _all_containers(workload: dict[str, Any]) -> list[dict[str, Any]]:
    spec = pod_spec(workload)
    return [*spec.get("initContainers", []), *spec["containers"]]


@pytest.mark.parametrize("name", ["Deployment/ember-platform", "DaemonSet/ember-agent"])
def test_every_container_is_locked_down(name: str) -> None:
    workload = find(*name.split("/"))
    spec = pod_spec(workload)
    assert spec["automountServiceAccountToken"] is False  # no Kubernetes API access: no Role is needed
    assert not any(spec.get(k) for k in ("hostNetwork", "hostPID", "hostIPC"))
    for c in _all_containers(workload):
        sc = c["securityContext"]
        assert sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"] is True
        assert sc["capabilities"]["drop"] == ["ALL"]
        assert not sc.get("privileged")
        assert "memory" in c["resources"]["limits"] and "cpu" in c["resources"]["requests"]
    for c in spec["containers"]:
        assert "runAsUser" not in c["securityContext"]  # the pod's non-root user
        assert spec["securityContext"]["runAsNonRoot"] is True and spec["securityContext"]["runAsUser"] != 0


def test_control_plane_meets_the_restricted_pod_security_standard() -> None:
    workload = find("Deployment", "ember-platform")
    spec = pod_spec(workload)
    assert spec["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
    assert {next(iter(set(v) - {"name"})) for v in spec["volumes"]} <= {"emptyDir", "projected", "secret"}
    for c in _all_containers(workload):
        assert not c["securityContext"]["capabilities"].get("add")
        assert c["securityContext"].get("runAsNonRoot", True) and c["securityContext"].get("runAsUser", 1) != 0
    keys = next(v for v in spec["volumes"] if v["name"] == "credentials")
    assert keys["emptyDir"]["medium"] == "Memory"  # the copied keys never reach a disk


def test_agent_gets_what_bwrap_needs_and_no_more() -> None:
    workload = find("DaemonSet", "ember-agent")
    spec = pod_spec(workload)
    agent = container(workload, "agent")
    # bwrap --proc needs an unmasked /proc, which Kubernetes allows only in a pod of its own user namespace
    assert agent["securityContext"]["procMount"] == "Unmasked" and spec["hostUsers"] is False
    assert spec["securityContext"]["seccompProfile"]["type"] == "Unconfined"
    assert spec["securityContext"]["appArmorProfile"]["type"] == "Unconfined"
    assert not agent["securityContext"]["capabilities"].get("add")
    prepare = container(workload, "prepare")  # root of the pod's user namespace, for chown alone
    assert prepare["securityContext"]["capabilities"]["add"] == ["CHOWN"]
    assert prepare["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
    creds = next(m for m in prepare["volumeMounts"] if m["name"] == "node-creds")
    assert creds["subPathExpr"] == "$(NODE_NAME)"  # this node's key of the Secret, not every node's
    assert not any(m["name"] == "node-creds" for m in agent["volumeMounts"])


def test_agent_takes_all_gpus_of_the_nodes_it_is_placed_on() -> None:
    workload = find("DaemonSet", "ember-agent")
    spec = pod_spec(workload)
    gpus = container(workload, "agent")["resources"]["limits"]["nvidia.com/gpu"]
    assert spec["nodeSelector"]["nvidia.com/gpu.count"] == str(gpus)
    assert spec["nodeSelector"]["nvidia.com/gpu.present"] == "true"
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]
    state = next(v for v in spec["volumes"] if v["name"] == "state")
    assert state["hostPath"] == {"path": "/var/lib/ember", "type": "DirectoryOrCreate"}
    policy = find("NetworkPolicy", "ember-agent-no-ingress")
    assert policy["spec"] == {"podSelector": {}, "policyTypes": ["Ingress"]}  # no rule: nothing comes in


def _quickstart_secrets(text: str) -> dict[tuple[str, str], set[str]]:
    """The Secrets the Kubernetes quickstart (docs/operations/kubernetes.md) creates: (namespace, name) -> keys
    ("*": a folder's files)."""
    section = text.replace("\\\n", " ")
    made: dict[tuple[str, str], set[str]] = {}
    for line in section.splitlines():
        words = line.split("#")[0].split()
        if "create" in words and "secret" in words and "--dry-run=client" not in words:
            namespace = words[words.index("-n") + 1]
            name = words[words.index("generic") + 1]
            keys = set()
            for word in words:
                if word.startswith("--from-file="):
                    source = word.removeprefix("--from-file=")
                    key, _, path = source.rpartition("=")
                    keys.add(key or ("*" if path.endswith("/") else Path(path).name))
            made[(namespace, name)] = keys
    return made


def test_the_kubernetes_quickstart_creates_every_secret_the_workloads_mount() -> None:
    page = (REPO / "docs" / "operations" / "kubernetes.md").read_text()
    made = _quickstart_secrets(page)
    wrong = _quickstart_secrets(page.replace("--from-file=token=./admin-token", "--from-file=./admin-token"))
    assert wrong[("ember", "ember-bootstrap-token")] == {"admin-token"}  # a key the Deployment does not mount
    for workload in (find("Deployment", "ember-platform"), find("DaemonSet", "ember-agent")):
        namespace = workload["metadata"]["namespace"]
        for name, key in _secret_refs(workload):
            assert (namespace, name) in made, f"the Kubernetes quickstart does not create {namespace}/{name}"
            assert key in made[(namespace, name)] or made[(namespace, name)] == {"*"}, (name, key)


def test_the_copy_step_makes_files_ember_accepts_from_a_secret_volume(tmp_path: Path) -> None:
    secrets, run = tmp_path / "secrets", tmp_path / "run"
    keys.init(tmp_path / "made")  # what the operator made, then put in the Secrets
    (secrets / "nats-auth").mkdir(parents=True)
    for name in ("platform.nk", "callout.json"):
        (secrets / "nats-auth" / name).write_bytes((tmp_path / "made" / name).read_bytes())
    (secrets / "bootstrap-token").write_text(read_token_file(tmp_path / "made" / "token") + "\n")
    (secrets / "secrets.key").write_bytes(write_key(tmp_path / "made" / "secrets.key").read_bytes())
    for path in secrets.rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o444)  # the projected volume's defaultMode
    with pytest.raises(CredentialsError, match="may be read by others"):
        keys.load(secrets / "nats-auth")  # why the copy step exists
    run.mkdir()
    script = container(find("Deployment", "ember-platform"), "credentials")["command"][-1]
    script = script.replace("/secrets/", f"{secrets}/").replace("/run/ember/", f"{run}/")
    done = subprocess.run(["/bin/sh", "-ec", script], capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode == 0, done.stderr
    assert keys.load(run / "nats-auth").platform_public == keys.load(tmp_path / "made").platform_public
    read_key(run / "secrets.key")
    assert read_token_file(run / "bootstrap-token").startswith("ember_")
    assert {oct(p.stat().st_mode & 0o777) for p in run.rglob("*") if p.is_file()} == {"0o400"}


def _matches(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items())


def test_nats_takes_clients_from_ember_alone_and_its_cluster_and_monitoring_ports_from_its_servers_alone() -> None:
    """Routes authenticate no peer by default: a pod (or a replica's code, going out through its agent's pod) that
    dials the cluster port joins as a server and reads every message; the monitoring port lists every app's
    streams and connections."""
    policy = find("NetworkPolicy", "nats-clients-and-peers-only")
    nats_pod = {"app.kubernetes.io/name": "nats", "app.kubernetes.io/instance": "nats",  # the chart's, release "nats"
                "app.kubernetes.io/component": "nats"}
    assert policy["metadata"]["namespace"] == "ember" and _matches(policy["spec"]["podSelector"], nats_pod)
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    by_port = {port["port"]: rule["from"] for rule in policy["spec"]["ingress"] for port in rule["ports"]}
    assert set(by_port) == {4222, 6222, 8222}  # nothing else is let in
    for port in (6222, 8222):
        assert all(_matches(peer["podSelector"], nats_pod) and "namespaceSelector" not in peer
                   for peer in by_port[port])
    platform, agent = find("Deployment", "ember-platform"), find("DaemonSet", "ember-agent")
    clients = by_port[4222]
    assert len(clients) == 2
    assert any(_matches(c["podSelector"], platform["spec"]["template"]["metadata"]["labels"])
               and "namespaceSelector" not in c for c in clients)  # the control plane, in NATS' namespace
    assert any(_matches(c["podSelector"], agent["spec"]["template"]["metadata"]["labels"])
               and c["namespaceSelector"]["matchLabels"] == {"kubernetes.io/metadata.name": agent["metadata"]
                                                             ["namespace"]} for c in clients)


def test_node_agents_reach_no_cloud_metadata_service_and_everything_else() -> None:
    """A sandbox whose NATS socket the agent cannot fence (this manifest's agent has no capability of the node)
    reaches what the agent's pod reaches: never the node's credentials at the metadata service."""
    policy, agent = find("NetworkPolicy", "agents-reach-no-metadata-service"), find("DaemonSet", "ember-agent")
    assert policy["metadata"]["namespace"] == agent["metadata"]["namespace"]
    assert _matches(policy["spec"]["podSelector"], agent["spec"]["template"]["metadata"]["labels"])
    assert policy["spec"]["policyTypes"] == ["Egress"] and "ingress" not in policy["spec"]
    (rule,) = policy["spec"]["egress"]
    assert "ports" not in rule  # every port of what is allowed: NATS, DNS, the internet
    blocks = {peer["ipBlock"]["cidr"]: set(peer["ipBlock"]["except"]) for peer in rule["to"]}
    assert set(blocks) == {"0.0.0.0/0", "::/0"}
    assert {"169.254.169.254/32", "100.100.100.200/32", "168.63.129.16/32"} <= blocks["0.0.0.0/0"]
    assert "169.254.20.10/32" not in blocks["0.0.0.0/0"] and "fd00:ec2::254/128" in blocks["::/0"]
