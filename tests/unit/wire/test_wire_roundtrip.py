"""Every wire message survives encoding, and decoders tolerate older and newer peers."""

import msgspec
import pytest

from ember import wire

_FUNCTION = wire.FunctionSpec(
    name="Classifier.predict", attr="predict", input_mode="single", params=["image"],
    input_schema={"$ref": "#/$defs/Image", "$defs": {"Image": {"type": "object"}}},
    output_schema={"type": "integer"}, batch=wire.Batch(max_size=16, window_ms=2.5))
_SERVICE = wire.ServiceSpec(name="Classifier", kind="class", functions=[_FUNCTION], gpu_count=2,
                            gpu_types=["H100", "A100"], min_replicas=0, max_replicas=4, timeout_s=30.0)
_PLAIN = wire.ServiceSpec(name="greet", kind="function",
                          functions=[wire.FunctionSpec(name="greet", attr="greet", input_mode="none")])
_MANIFEST = wire.Manifest(app="digits", module="classifier", services=[_SERVICE, _PLAIN], sdk_version="0.1.0",
                          python="3.11")
_HIST = wire.Histogram(bounds=[1.0, 2.0, 4.0], counts=[3, 1, 0, 2], sum=19.0, count=6)
_STATS = wire.FunctionStats(function="Classifier.predict", calls=10, batches=4, expired=1, rejected=2, cancelled=0,
                            failed=1, queue_depth=3, fill_ratio=0.5, batch_size=_HIST, queue_wait_s=_HIST, run_s=_HIST)
_REPLICA = wire.ReplicaStatus(replica_id="r-1", node_id="n-1", app="digits", service="Classifier", version=3,
                              state="ready", pid=4242, started_at=1.5, updated_at=2.5, restarts=1,
                              message="ok", calls=10, batches=4, functions=[_STATS])
_ERROR = wire.ErrorInfo(code="invalid_input", message="Expected `int`", field="$.a", type="ValueError",
                        retry_after_s=1.5, call_id="c-1")
_DEPLOYMENT = wire.Deployment(app="digits", version=3, bundle_sha256="ab" * 32, manifest=_MANIFEST, created_at=1.25)
_NODE = wire.NodeInfo(node_id="n-1", hostname="host", devices=[wire.Device(kind="cpu", index=0, name="cpu")],
                      updated_at=3.0)
_ANSWER = wire.Answer(call_id="c-1", output=msgspec.Raw(b'{"label":7,"scores":[0.25,0.75]}'), batch_size=4)
_INVOCATION = wire.Invocation(call_id="c-1", function="Classifier.predict", deadline=1.5e9,
                              input=msgspec.Raw(b'{"pixels":[0,16]}'))
_LOG = wire.LogLine(replica_id="r-1", stream="stderr", line="Traceback…", ts=4.0)

_NODE_VIEW = wire.NodeView(node_id="n-1", hostname="host", updated_at=3.0,
                           devices=[wire.DeviceView(kind="cpu", index=0, name="cpu")],
                           replicas=[wire.NodeReplicaView(replica_id="r-2", app="a", service="s", version=1,
                                                          state="ready")])
_SERVICE_STATUS = wire.ServiceStatus(app="digits", service="Classifier", version=3, functions=["Classifier.predict"],
                                     min_replicas=0, max_replicas=4, scaled=True, desired=2, ready=1, starting=1,
                                     queue_depth=3, pending=7, unschedulable="no GPU fits")

SAMPLES: list[msgspec.Struct] = [
    wire.TensorSignature(inputs=[wire.TensorMeta(name="x", datatype="FP32", shape=[-1, 4])],
                         outputs=[wire.TensorMeta(name="output")]),
    wire.CompactTensor(datatype="UINT8", shape=[2], data=b"\x00\xff"),
    wire.InferRequest(id="r1", parameters={"binary_data_output": True},
                      inputs=[wire.InferInput(name="x", shape=[1, 2], datatype="FP32", data=[1.0, 2.0]),
                              wire.InferInput(name="y", shape=[2], datatype="INT8",
                                              parameters={"binary_data_size": 2})],
                      outputs=[wire.RequestedOutput(name="output", parameters={"binary_data": True})]),
    wire.InferResponse(model_name="a.f", model_version="2", id="r1",
                       outputs=[wire.InferOutput(name="output", datatype="FP32", shape=[1], data=[0.5]),
                                wire.InferOutput(name="output", datatype="FP32", shape=[1],
                                                 parameters={"binary_data_size": 4})]),
    wire.ModelMetadata(name="a.f", versions=["2"], platform="ember", inputs=[wire.TensorMeta(name="x")],
                       outputs=[wire.TensorMeta(name="output", datatype="INT64", shape=[1])]),
    wire.ModelReady(name="a.f", ready=True),
    wire.ServerMetadata(name="ember", version="0.1.0", extensions=["binary_tensor_data"]),
    wire.RepositoryModel(name="a.f", version="2", state="UNAVAILABLE", reason="no replica is ready"),
    wire.IndexRequest(ready=True),
    wire.OipError(error="no model named 'x'"),
    wire.TensorMeta(name="x", datatype="BOOL", shape=[3]),
    wire.InferInput(name="x", shape=[2, 2], datatype="INT32", data=[[1, 2], [3, 4]]),
    wire.RequestedOutput(name="output"),
    wire.InferOutput(name="output", datatype="BOOL", shape=[2], data=[True, False]),
    wire.Batch(max_size=8, window_ms=0.0),
    wire.Batch(max_size=8, window_ms=1.0, latency_budget_ms=20.0, max_cost=4096.0),
    wire.Continuous(max_seqs=8),
    _HIST,
    _STATS,
    wire.Retries(max_retries=3, initial_delay_s=0.5, backoff_coefficient=3.0, max_delay_s=10.0),
    wire.CallRecord(call_id="c-1", app="digits", function="Classifier.predict", status="succeeded", created_at=1.0,
                    updated_at=2.0, attempts=2, output=msgspec.Raw(b'{"label":7}')),
    wire.CallRecord(call_id="c-2", app="digits", function="f", status="failed", created_at=1.0, updated_at=2.0,
                    attempts=1, error=_ERROR, input_sha256="ab" * 32),
    wire.SpawnReply(call_id="c-1", status="queued", created=False),
    wire.DeadLetter(call_id="c-2", app="digits", function="f", error=_ERROR, attempts=4, dead_at=3.0,
                    input=msgspec.Raw(b'{"pixels":[1]}')),
    wire.ReplayReply(replayed=["c-3", "c-4"]),
    wire.ReplayRequest(function="f", call_ids=["c-2"]),
    wire.ScaleRequest(service="Classifier", min_replicas=1, max_replicas=4),
    wire.TokenRequest(scopes=["invoke", "read"], apps=["team-a-*"], name="ci", ttl="30d"),
    wire.TokenInfo(id="0a1b2c3d4e5f", name="ci", scopes=["deploy"], apps=["hello"], created_at=1.0, expires_at=2.0,
                   created_by="admin"),
    wire.StoredToken(info=wire.TokenInfo(id="admin", name="first admin", scopes=["admin"], apps=["*"],
                                         created_at=1.0), secret_sha256="ab" * 32, revoked_at=3.0),
    wire.NewToken(token="ember_0a1b2c3d4e5f_" + "x" * 32,
                  info=wire.TokenInfo(id="0a1b2c3d4e5f", name="", scopes=["read"], apps=["*"], created_at=1.0)),
    wire.QuotaRequest(apps="team-a-*", max_replicas=4, max_gpu_memory_mb=81920, rate_per_s=50.0, burst=100),
    wire.Quota(name="team-a", token="0a1b2c3d4e5f", max_concurrent_calls=8, created_at=1.0, created_by="admin"),
    wire.SecretRequest(values={"HF_TOKEN": "hf_x"}, apps=["team-*"]),
    wire.StoredSecret(name="hf", keys=["HF_TOKEN"], ciphertext="gAAAA", created_at=1.0, updated_at=2.0, updated_by="a"),
    wire.SecretView(name="hf", keys=["HF_TOKEN"], created_at=1.0, updated_at=2.0),
    wire.SecretsRequest(replica_id="r-1"),
    wire.SecretsAnswer(env={"HF_TOKEN": "hf_x"}),
    wire.SecretsAnswer(error="not assigned"),
    wire.VolumeMount(path="/weights", name="w", version=2),
    wire.VolumeFile(path="a/b.pt", size=3, chunks=["a" * 64], executable=True),
    wire.VolumeCommit(files=[wire.VolumeFile(path="b", size=0, chunks=[])]),
    wire.VolumeVersion(name="w", version=1, files=[], size=0, created_at=1.0),
    wire.ChunksQuery(chunks=["b" * 64]),
    wire.ChunksMissing(missing=[]),
    wire.VolumeView(name="w", version=1, size=3, file_count=1, created_at=1.0, versions=[1],
                    files=[wire.VolumeFileView(path="a", size=3)], used_by=["app"]),
    wire.VolumeFileView(path="a", size=3),
    wire.QuotaView(quota=wire.Quota(name="q", apps="*", max_replicas=1),
                   usage=wire.QuotaUsage(replicas=1, gpu_memory_mb=24576, calls_in_flight=3)),
    wire.QuotaUsage(),
    wire.SlotAssignment(replica_id="r-1", app="digits", service="Classifier", version=3, index=0,
                        gpu_uuids=["GPU-1"], gpu_indices=[0], numa_node=1, bundle_sha256="ab" * 32,
                        module="classifier"),
    wire.NodeAssignment(node_id="n-1", slots=[wire.SlotAssignment(replica_id="r-2", app="a", service="s", version=1,
                                                                  index=1)], updated_at=5.0,
                        zygotes=[wire.ZygoteAssignment(app="a", service="s", version=1, bundle_sha256="cd" * 32,
                                                       module="a")]),
    wire.ZygoteAssignment(app="b", service="s", version=2, bundle_sha256="ef" * 32, module="b"),
    wire.ZygoteStatus(app="a", service="s", version=1, state="ready", pid=42, rss_mb=310, build_s=1.7, forks=3),
    wire.ScaleBounds(min_replicas=2, max_replicas=5),
    wire.StartPhases(kind="cold", fetch_s=0.1, interpreter_s=0.2, imports_s=1.5, setup_s=0.3, ready_s=2.2,
                     first_call_s=0.01),
    wire.LoadReport(replica_id="r-1", app="digits", function="Classifier.predict", version=3, queued=4, in_flight=8,
                    per_call_s=0.0005),
    wire.DeviceView(kind="gpu", index=0, name="A10G", uuid="GPU-1", memory_total_mb=24_576, memory_free_mb=23_552,
                    memory_reserved_mb=24_576, replicas=["r-1"]),
    wire.NodeReplicaView(replica_id="r-1", app="digits", service="Classifier", version=3, state="assigned",
                         gpu_uuids=["GPU-1"]),
    _NODE_VIEW,
    _SERVICE_STATUS,
    wire.StatusView(nodes=[_NODE_VIEW], services=[_SERVICE_STATUS]),
    _FUNCTION,
    _SERVICE,
    _PLAIN,
    _MANIFEST,
    wire.Manifest(app="empty", module="m", services=[]),
    _DEPLOYMENT,
    wire.Device(kind="gpu", index=0, name="NVIDIA H100", memory_total_mb=81_559, uuid="GPU-1"),
    _NODE,
    _REPLICA,
    _ERROR,
    wire.ErrorInfo(code="internal", message="boom"),
    wire.ErrorBody(error=_ERROR),
    _ANSWER,
    wire.Answer(call_id="c-2"),
    wire.Answer(call_id="c-3", ack="r-1"),
    wire.Answer(call_id="c-4", error=_ERROR),
    _INVOCATION,
    _LOG,
    wire.DeployRequest(bundle_sha256="cd" * 32, manifest=_MANIFEST),
    wire.DeployRequest(bundle_sha256="cd" * 32, manifest=_MANIFEST, canary_percent=20),
    wire.RolloutRequest(version=3),
    wire.TrafficShare(version=2, percent=80),
    wire.Release(version=1, bundle_sha256="ef" * 32, manifest=_MANIFEST, created_at=1.0),
    wire.Deployment(app="digits", version=3, bundle_sha256="ab" * 32, manifest=_MANIFEST, created_at=2.0,
                    releases=[wire.Release(version=2, bundle_sha256="ef" * 32, manifest=_MANIFEST, created_at=1.0)],
                    traffic=[wire.TrafficShare(version=2, percent=80), wire.TrafficShare(version=3, percent=20)],
                    canary_percent=20, stable=2, switched_at=3.0, latest=3),
    wire.VersionView(version=3, percent=20, state="canary", bundle_sha256="ab" * 32, created_at=2.0, ready=1),
    wire.ServiceView(name="Classifier", min_replicas=0, max_replicas=4, functions=["Classifier.predict"],
                     replicas=[_REPLICA]),
    wire.AppView(app="digits", version=3, bundle_sha256="ab" * 32, created_at=1.0,
                 services=[wire.ServiceView(name="greet", min_replicas=1, max_replicas=1, functions=["greet"],
                                            replicas=[])]),
]


def _wire_types() -> set[type[msgspec.Struct]]:
    return {v for v in vars(wire).values()
            if isinstance(v, type) and issubclass(v, msgspec.Struct) and v.__module__.startswith("ember.wire.")}


# Bodies users write by hand (``ember scale``, replay requests): a misspelt field is refused, not ignored.
USER_WRITTEN = {wire.ScaleRequest, wire.ReplayRequest, wire.TokenRequest, wire.QuotaRequest, wire.SecretRequest,
                wire.RolloutRequest, wire.VolumeCommit, wire.ChunksQuery}


def test_the_wire_package_exports_every_wire_type() -> None:
    assert len(_wire_types()) == len(set(wire.__all__) & {t.__name__ for t in _wire_types()}) > 30


def test_every_wire_type_has_a_sample() -> None:
    missing = _wire_types() - {type(s) for s in SAMPLES}
    assert not missing, f"add a sample of {sorted(t.__name__ for t in missing)} to SAMPLES"


@pytest.mark.parametrize("value", SAMPLES, ids=lambda v: type(v).__name__)
def test_json_roundtrip(value: msgspec.Struct) -> None:
    data = wire.encoder.encode(value)
    assert msgspec.json.decode(data, type=type(value)) == value


@pytest.mark.parametrize(("decoder", "value"), [
    (wire.deployment_decoder, _DEPLOYMENT),
    (wire.replica_decoder, _REPLICA),
    (wire.node_decoder, _NODE),
    (wire.log_decoder, _LOG),
])
def test_module_decoders(decoder: msgspec.json.Decoder, value: msgspec.Struct) -> None:
    assert decoder.decode(wire.encoder.encode(value)) == value


def test_frames_carry_raw_json_verbatim() -> None:
    body, output = b'{"pixels": [0, 16], "note": "spaces kept"}', b'{"label": 7}'
    call = wire.Invocation(call_id="c-1", function="f", deadline=2.0, input=msgspec.Raw(body))
    (decoded,) = wire.invocations_decoder.decode(wire.encoder.encode([call]))
    assert bytes(decoded.input) == body
    sent = wire.Answer(call_id="c-1", output=msgspec.Raw(output))
    (answer,) = wire.answers_decoder.decode(wire.encoder.encode([sent]))
    assert bytes(answer.output) == output


def test_answer_defaults_and_older_peers() -> None:
    # Frames are arrays: a peer that knows fewer trailing fields sends shorter ones, one that knows more longer ones.
    (answer,) = wire.answers_decoder.decode(b'[["c-1"]]')
    assert (answer.ack, bytes(answer.output), answer.error, answer.batch_size) == ("", b"null", None, 0)
    (newer,) = wire.answers_decoder.decode(b'[["c-1","",1,null,3,"a field from the future"]]')
    assert (bytes(newer.output), newer.batch_size) == (b"1", 3)


def test_wire_types_are_frozen() -> None:
    with pytest.raises(AttributeError):
        _REPLICA.state = "crashed"  # type: ignore[misc]
    updated = msgspec.structs.replace(_REPLICA, state="crashed")
    assert (updated.state, _REPLICA.state) == ("crashed", "ready")


@pytest.mark.parametrize("cls", sorted(_wire_types(), key=lambda t: t.__name__), ids=lambda t: t.__name__)
def test_wire_types_do_not_forbid_unknown_fields(cls: type[msgspec.Struct]) -> None:
    assert cls.__struct_config__.frozen
    assert cls.__struct_config__.forbid_unknown_fields == (cls in USER_WRITTEN)


def test_wire_types_are_keyword_only() -> None:
    # kw_only is not inherited by msgspec subclasses: each wire type must declare it itself.
    positional = []
    for cls in _wire_types():
        fields = msgspec.structs.fields(cls)
        try:
            cls(*[object()] * len(fields))
        except TypeError:
            continue
        except Exception:  # __post_init__ validation (Batch) means the positional call was accepted
            pass
        positional.append(cls.__name__)
    assert positional == []


# --- schema evolution --------------------------------------------------------------------------


def test_decoder_ignores_unknown_fields() -> None:
    data = msgspec.json.encode({
        **msgspec.structs.asdict(_REPLICA), "gpu_util": 0.5, "future": {"nested": [1, 2]},
    })
    assert wire.replica_decoder.decode(data) == _REPLICA


def test_decoder_fills_defaults_for_missing_new_fields() -> None:
    old = {"replica_id": "r-1", "node_id": "n-1", "app": "digits", "service": "Classifier", "version": 3,
           "state": "starting", "pid": 1, "started_at": 1.0, "updated_at": 1.0}
    status = wire.replica_decoder.decode(msgspec.json.encode(old))
    assert (status.restarts, status.message, status.calls, status.batches) == (0, "", 0, 0)


def test_nested_decoders_tolerate_older_and_newer_peers() -> None:
    manifest = {
        "app": "digits", "module": "classifier", "added_later": True,
        "services": [{"name": "greet", "kind": "function", "region": "eu",
                      "functions": [{"name": "greet", "attr": "greet", "input_mode": "single", "v2": 1}]}],
    }
    data = msgspec.json.encode({"app": "digits", "version": 1, "bundle_sha256": "ab", "manifest": manifest,
                                "created_at": 1.0, "labels": {"team": "ml"}})
    deployment = wire.deployment_decoder.decode(data)
    (service,) = deployment.manifest.services
    assert (service.gpu_count, service.gpu_types, service.min_replicas, service.max_replicas) == (0, [], 1, 1)
    assert service.functions[0] == wire.FunctionSpec(name="greet", attr="greet", input_mode="single")
    assert deployment.manifest.sdk_version == ""


def test_an_older_peer_decodes_a_newer_message() -> None:
    class OldReplicaStatus(msgspec.Struct, frozen=True, kw_only=True):
        replica_id: str
        node_id: str
        app: str
        service: str
        version: int
        state: str
        pid: int
        started_at: float
        updated_at: float
        restarts: int = 0
        message: str = ""

    old = msgspec.json.decode(wire.encoder.encode(_REPLICA), type=OldReplicaStatus)
    assert (old.replica_id, old.state, old.restarts) == ("r-1", "ready", 1)


def test_decoding_checks_types_and_literals() -> None:
    with pytest.raises(msgspec.ValidationError, match=r"\$\.state"):
        wire.replica_decoder.decode(wire.encoder.encode(_REPLICA).replace(b'"ready"', b'"sleeping"'))
    with pytest.raises(msgspec.ValidationError, match="max_size must be an int from 1 to 4096"):
        msgspec.json.decode(b'{"max_size": 0}', type=wire.Batch)


def test_frames_are_cut_to_stay_within_a_message() -> None:
    overhead = wire.FRAME_ITEM_OVERHEAD_BYTES
    items, sizes = list("abcde"), [100, 100, 900, 100, 5000]
    assert wire.split_frames(items, sizes, 1000 + 2 * overhead) == [["a", "b"], ["c", "d"], ["e"]]
    assert wire.split_frames(items, sizes, 10**6) == [items]
    assert wire.split_frames([], [], 1000) == []
