"""deploy/kubernetes/nats-values.yaml, for the official NATS Helm chart: it uses only keys the chart has, and
the server configuration the chart renders from it, with Ember's auth.conf beside it, is one the real
nats-server accepts (``nats-server -t``) and refuses without auth.conf."""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from k8s_docs import K8S

from ember.dev.embedded import nats_server_binary
from ember_platform.natsauth import keys

VALUES = K8S / "nats-values.yaml"

# Keys of the chart's values.yaml (nats-io/k8s, helm/charts/nats/values.yaml, chart 2.14.2), for the sections
# the values file sets; a path here may be set, and so may anything under one of FREE_FORM, which the chart
# merges as given (NATS configuration, a container's env and resources, a ConfigMap's data, spread constraints).
CHART_KEYS = {
    "config.cluster.enabled", "config.cluster.port", "config.cluster.replicas", "config.cluster.noAdvertise",
    "config.jetstream.enabled", "config.jetstream.fileStore.enabled", "config.jetstream.fileStore.dir",
    "config.jetstream.fileStore.pvc.enabled", "config.jetstream.fileStore.pvc.size",
    "config.jetstream.fileStore.pvc.storageClassName", "config.jetstream.fileStore.maxSize",
    "config.jetstream.memoryStore.enabled", "config.jetstream.memoryStore.maxSize",
    "config.monitor.enabled", "config.monitor.port", "config.nats.port", "config.serverNamePrefix",
    "podTemplate.configChecksumAnnotation", "podDisruptionBudget.enabled", "natsBox.enabled",
    "reloader.enabled", "promExporter.enabled", "service.enabled", "serviceAccount.enabled",
}
FREE_FORM = ("config.merge", "config.cluster.merge", "config.jetstream.merge", "container.env",
             "container.resources", "container.merge", "podTemplate.topologySpreadConstraints",
             "podTemplate.merge", "configMap.merge", "statefulSet.merge")


def _leaves(tree: dict[str, Any], prefix: str = "") -> list[str]:
    out: list[str] = []
    for key, value in tree.items():
        path = f"{prefix}{key}"
        if any(path == f or path.startswith(f + ".") for f in FREE_FORM):
            out.append(path)
        elif isinstance(value, dict):
            out += _leaves(value, path + ".")
        else:
            out.append(path)
    return out


def _unknown(values: dict[str, Any]) -> list[str]:
    return [p for p in _leaves(values) if p not in CHART_KEYS and not any(p.startswith(f) for f in FREE_FORM)]


@pytest.fixture
def values() -> dict[str, Any]:
    loaded = yaml.safe_load(VALUES.read_text())
    assert isinstance(loaded, dict)
    return loaded


def test_values_use_only_the_charts_keys(values: dict[str, Any]) -> None:
    assert _unknown(values) == []
    misspelt = copy.deepcopy(values)
    misspelt["config"]["jetstream"]["filestore"] = {"enabled": True}  # the chart would ignore it silently
    assert _unknown(misspelt) == ["config.jetstream.filestore.enabled"]


def test_a_three_server_jetstream_cluster_on_files(values: dict[str, Any]) -> None:
    config = values["config"]
    assert config["cluster"] == {"enabled": True, "replicas": 3}
    assert config["jetstream"]["enabled"] and config["jetstream"]["fileStore"]["enabled"]
    assert config["jetstream"]["fileStore"]["pvc"]["enabled"]
    assert config["jetstream"]["memoryStore"]["enabled"] is False
    spread = values["podTemplate"]["topologySpreadConstraints"]["kubernetes.io/hostname"]
    assert spread["whenUnsatisfiable"] == "DoNotSchedule"
    assert values["natsBox"]["enabled"] is False  # anonymous: Ember's servers would refuse it


def render_server_config(values: dict[str, Any], release: str = "nats") -> str:
    """nats.conf as the chart writes it for these values (files/config/*.yaml and nats.formatConfig in
    nats-io/k8s, for what the values set): JSON, with ``<< x >>`` unquoted and ``...$include`` keys made
    ``include`` directives."""
    config = values["config"]
    conf: dict[str, Any] = {"server_name": "<< $SERVER_NAME >>", "lame_duck_grace_period": "10s",
                            "lame_duck_duration": "30s", "pid_file": "/var/run/nats/nats.pid", "port": 4222}
    if config["cluster"]["enabled"]:
        conf["cluster"] = {"name": release, "port": 6222, "no_advertise": True,
                           "routes": [f"nats://{release}-{i}.{release}-headless:6222"
                                      for i in range(config["cluster"]["replicas"])]}
    if config["monitor"]["enabled"]:
        conf["http_port"] = 8222
    store = config["jetstream"]["fileStore"]
    conf["jetstream"] = {"max_memory_store": 0, "store_dir": store["dir"],
                         "max_file_store": f"<< {store.get('maxSize') or store['pvc']['size']} >>"}
    conf.update(config.get("merge", {}))
    text = json.dumps(conf, indent=2, sort_keys=True)
    text = re.sub(r'".*\$include": "(.*)",?', r"include \1;", text)
    return re.sub(r'"<<\s+(.*?)\s+>>"', r"\1", text)


def _check(config_dir: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SERVER_NAME": "nats-0"}
    return subprocess.run([nats_server_binary(), "-c", str(config_dir / "nats.conf"), "-t"], capture_output=True,
                          text=True, timeout=30, env=env, check=False)


def test_the_rendered_config_with_embers_auth_is_valid_and_invalid_without(values: dict[str, Any],
                                                                          tmp_path: Path) -> None:
    # the chart mounts its ConfigMap (nats.conf, and auth.conf given with --set-file) in one folder
    rendered = render_server_config(values)
    rendered = rendered.replace('"/data"', json.dumps(str(tmp_path / "data")))
    (tmp_path / "nats.conf").write_text(rendered)
    assert rendered.lstrip("{ \n").startswith("include auth.conf;")
    assert '"max_payload": 8MB' in rendered  # a unit nats-server reads; quoted, it is refused

    missing = _check(tmp_path)
    assert missing.returncode != 0 and "auth.conf" in missing.stderr + missing.stdout  # never up without auth

    auth = keys.init(tmp_path / "nats-auth")
    (tmp_path / "auth.conf").write_text((tmp_path / "nats-auth" / keys.SERVER_CONF_FILE).read_text())
    done = _check(tmp_path)
    assert done.returncode == 0, done.stderr + done.stdout
    assert auth.platform_public in (tmp_path / "auth.conf").read_text()

    (tmp_path / "nats.conf").write_text(rendered.replace('"max_payload": 8MB', '"max_payload": "8MB"'))
    assert _check(tmp_path).returncode != 0  # why the values write << 8MB >>
