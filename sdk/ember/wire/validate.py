"""The one validator of what an app declares: a manifest, and run-time scale bounds.

The SDK runs it before a push (``ember.App.manifest``) and the platform runs it again on every deployment and
scale request, since a request may come from anything that speaks HTTP: what reaches the control loop has
passed it. Each problem names the field at fault as a JSON path into the request (``$.manifest.services[0]
.buffer_replicas``); the decorators check their arguments earlier with messages of their own, against the
same bounds, which live here.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator

from ember._errors import InvalidInputError, InvalidSpecError
from ember._resources import MAX_GPUS, GpuRequest
from ember.wire.images import image_problems
from ember.wire.openai import MODEL_NAME
from ember.wire.schedules import problem as schedule_problem
from ember.wire.secrets import MAX_SECRETS_PER_SERVICE, name_problem
from ember.wire.specs import RESERVED_APP_NAMES, FunctionSpec, Manifest, ServiceSpec
from ember.wire.tensors import DATATYPES, MAX_TENSOR_RANK
from ember.wire.volumes import MAX_VOLUMES_PER_SERVICE, VolumeMount, mount_problem
from ember.wire.volumes import name_problem as volume_name_problem

APP_NAME = re.compile(r"[a-z0-9][a-z0-9-]{0,62}")


def is_app_name(name: str) -> bool:
    """Whether ``name`` may name an app: ``APP_NAME``, and not a word the HTTP API's paths take."""
    return bool(APP_NAME.fullmatch(name)) and name not in RESERVED_APP_NAMES
PY_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
MODULE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")
SUBJECT_TOKEN = re.compile(r"[A-Za-z0-9_-]+")
# Subjects no app may bind or publish results to: Ember's own, inboxes, and every root starting with '$' (the
# server's, JetStream's, KV's and object stores' APIs).
RESERVED_SUBJECT_ROOTS = frozenset({"ember", "_EMBER", "_INBOX"})
EVENTS_ROOT = "events"  # events.<app> and events.<app>.> belong to that app (owned_subjects)

MAX_REPLICAS = 1000  # per service; more than the control loop should ever place for one service
MAX_BUFFER_REPLICAS = 100
MAX_TIMEOUT_S = 24 * 3600.0
MAX_SCALEDOWN_WINDOW_S = 24 * 3600.0
MAX_HOST_MEMORY_MB = 16 * 1024 * 1024
MAX_SERVICES = 100
MAX_FUNCTIONS = 100  # per service
MAX_SUBJECTS = 16  # per function (on=)
MAX_SUBJECT_LENGTH = 256
MAX_BODY_BYTES = 1024 * 1024 * 1024  # max_body_bytes= of a function, at most (a platform caps it lower)
MAX_CALLED_APPS = 64  # App(calls=[...])
MAX_CONCURRENCY = 1024  # calls one replica may hold at once (max_concurrency=)
STREAM_BATCH_PROBLEM = ("a streaming (generator) function cannot be batched: each call's items go to its own caller "
                        "as they come; drop batch=, or return a list instead of yielding")

Problem = tuple[str, str]  # (JSON path of the field, what is wrong)


def check_manifest(manifest: Manifest, at: str = "$.manifest") -> None:
    """Raise ``InvalidInputError`` (422) naming the first field of ``manifest`` at fault."""
    for field, message in manifest_problems(manifest, at):
        raise InvalidInputError(message, field=field)


def check_scale(min_replicas: int, max_replicas: int, at: str = "$") -> None:
    """Raise ``InvalidInputError`` (422) unless the bounds are ones a service may have."""
    for field, message in _bounds(min_replicas, max_replicas, at):
        raise InvalidInputError(message, field=field)


def manifest_problems(manifest: Manifest, at: str = "$.manifest") -> Iterator[Problem]:
    if not is_app_name(manifest.app):
        yield (f"{at}.app", f"app name {manifest.app!r}: 1 to 63 lowercase letters, digits and '-', starting with a "
                            f"letter or digit, and not one of {sorted(RESERVED_APP_NAMES)}")
    if not MODULE_NAME.fullmatch(manifest.module):
        yield f"{at}.module", f"module {manifest.module!r} is not an importable module name"
    if not 1 <= len(manifest.services) <= MAX_SERVICES:
        yield f"{at}.services", f"an app serves 1 to {MAX_SERVICES} services, not {len(manifest.services)}"
    yield from _duplicates([s.name for s in manifest.services], f"{at}.services", "service")
    for i, service in enumerate(manifest.services):
        yield from _service_problems(service, f"{at}.services[{i}]")
    yield from _calls(manifest.calls, f"{at}.calls")
    models = [fn.openai for svc in manifest.services for fn in svc.functions if fn.openai]
    yield from _duplicates(models, f"{at}.services", "openai model")


def _calls(apps: list[str], at: str) -> Iterator[Problem]:
    """The apps named in ``App(calls=[...])``: app names, each once, at most ``MAX_CALLED_APPS``."""
    if len(apps) > MAX_CALLED_APPS:
        yield at, f"an app may call at most {MAX_CALLED_APPS} other apps, not {len(apps)}"
    for i, name in enumerate(apps[:MAX_CALLED_APPS]):
        if not is_app_name(name):
            yield f"{at}[{i}]", f"{name[:80]!r} is not an app name (1 to 63 lowercase letters, digits and '-')"
        elif name in apps[:i]:
            yield f"{at}[{i}]", f"app {name!r} is named twice"


def _service_problems(svc: ServiceSpec, at: str) -> Iterator[Problem]:
    if not PY_NAME.fullmatch(svc.name):
        yield f"{at}.name", f"service name {svc.name!r} is not a Python name"
    if not 1 <= len(svc.functions) <= MAX_FUNCTIONS:
        yield f"{at}.functions", f"a service serves 1 to {MAX_FUNCTIONS} functions, not {len(svc.functions)}"
    yield from _duplicates([f.name for f in svc.functions], f"{at}.functions", "function")
    for i, fn in enumerate(svc.functions):
        yield from _function_problems(fn, svc, f"{at}.functions[{i}]")
    yield from _bounds(svc.min_replicas, svc.max_replicas, at)
    numbers = [
        ("timeout_s", svc.timeout_s, 0.0, MAX_TIMEOUT_S, False),
        ("startup_timeout_s", svc.startup_timeout_s, 0.0, MAX_TIMEOUT_S, False),
        ("scaledown_window_s", svc.scaledown_window_s, 0.0, MAX_SCALEDOWN_WINDOW_S, True),
        ("buffer_replicas", svc.buffer_replicas, 0, MAX_BUFFER_REPLICAS, True),
        ("memory_mb", svc.memory_mb, 0, MAX_HOST_MEMORY_MB, True),
        ("gpu_count", svc.gpu_count, 0, MAX_GPUS, True),
    ]
    for name, value, low, high, low_ok in numbers:
        if not (math.isfinite(value) and (low <= value if low_ok else low < value) and value <= high):
            yield f"{at}.{name}", f"{name}={value!r}: from {low} ({'inclusive' if low_ok else 'exclusive'}) to {high}"
    if svc.target_p95_ms is not None and not (math.isfinite(svc.target_p95_ms) and svc.target_p95_ms > 0):
        yield f"{at}.target_p95_ms", f"target_p95_ms={svc.target_p95_ms!r}: a positive number of milliseconds, or null"
    for i, kind in enumerate(svc.gpu_types):
        if not SUBJECT_TOKEN.fullmatch(kind) or len(kind) > 64:
            yield f"{at}.gpu_types[{i}]", f"GPU type {kind!r}: letters, digits, '-' and '_'"
    if svc.gpu is None and svc.gpu_count:  # the request the scheduler builds from these: a type as a name, once
        try:
            GpuRequest(count=svc.gpu_count, types=tuple(svc.gpu_types))
        except InvalidSpecError as exc:
            yield f"{at}.gpu_types", exc.message.removeprefix("gpu: ")
    if svc.gpu is not None and svc.gpu_count != max(svc.gpu.count, 1):
        yield f"{at}.gpu_count", f"gpu_count={svc.gpu_count} disagrees with gpu.count={svc.gpu.count}"
    yield from _secrets(svc.secrets, f"{at}.secrets")
    yield from _volumes(svc.volumes, f"{at}.volumes")
    if svc.image is not None:
        yield from image_problems(svc.image, f"{at}.image")


def _volumes(mounts: list[VolumeMount], at: str) -> Iterator[Problem]:
    if len(mounts) > MAX_VOLUMES_PER_SERVICE:
        yield at, f"a service mounts at most {MAX_VOLUMES_PER_SERVICE} volumes, not {len(mounts)}"
    for i, mount in enumerate(mounts):
        problem = mount_problem(mount.path)
        if problem:
            yield f"{at}[{i}].path", problem
        elif any(m.path == mount.path or mount.path.startswith(m.path + "/") or m.path.startswith(mount.path + "/")
                 for m in mounts[:i]):
            yield f"{at}[{i}].path", f"mount path {mount.path!r} is the same as, or inside, another volume's"
        problem = volume_name_problem(mount.name)
        if problem:
            yield f"{at}[{i}].name", problem
        if isinstance(mount.version, bool) or not 0 <= mount.version < 2**53:
            yield f"{at}[{i}].version", f"version={mount.version!r}: a whole number, 0 for the latest"


def _secrets(names: list[str], at: str) -> Iterator[Problem]:
    if len(names) > MAX_SECRETS_PER_SERVICE:
        yield at, f"a service names at most {MAX_SECRETS_PER_SERVICE} secrets, not {len(names)}"
    for i, name in enumerate(names):
        problem = name_problem(name)
        if problem:
            yield f"{at}[{i}]", problem
        elif name in names[:i]:
            yield f"{at}[{i}]", f"secret {name!r} is named twice"


def _function_problems(fn: FunctionSpec, svc: ServiceSpec, at: str) -> Iterator[Problem]:
    parts = fn.name.split(".")
    expected = 1 if svc.kind == "function" else 2
    if len(parts) != expected or not all(PY_NAME.fullmatch(p) for p in parts) \
            or (svc.kind == "class" and parts[0] != svc.name):
        shape = "a Python name" if svc.kind == "function" else f"'{svc.name}.<method>'"
        yield f"{at}.name", f"function name {fn.name!r}: {shape}"
    if fn.schedule is not None and (found := schedule_problem(fn.schedule)) is not None:
        yield f"{at}.schedule.{found[0]}", found[1]
    if not PY_NAME.fullmatch(fn.attr):
        yield f"{at}.attr", f"attr {fn.attr!r} is not a Python name"
    for i, param in enumerate(fn.params):
        if not PY_NAME.fullmatch(param):
            yield f"{at}.params[{i}]", f"parameter {param!r} is not a Python name"
    if not 0 <= fn.max_body_bytes <= MAX_BODY_BYTES:
        yield f"{at}.max_body_bytes", f"max_body_bytes={fn.max_body_bytes}: from 1 to {MAX_BODY_BYTES}, or 0"
    if fn.tensors is not None:
        yield from _tensor_problems(fn, f"{at}.tensors")
    if len(fn.on) > MAX_SUBJECTS:
        yield f"{at}.on", f"a function binds at most {MAX_SUBJECTS} subjects, not {len(fn.on)}"
    for i, subject in enumerate(fn.on):
        problem = subject_problem(subject, wildcards=True)
        if problem:
            yield f"{at}.on[{i}]", problem
    yield from _concurrency_problems(fn, at)
    yield from _openai_problems(fn, at)
    if fn.result_subject is not None:
        problem = subject_problem(fn.result_subject, wildcards=False)
        if problem:
            yield f"{at}.result_subject", problem
        elif not fn.on:
            yield f"{at}.result_subject", "only events have result subjects; bind the function with on= too"


def _concurrency_problems(fn: FunctionSpec, at: str) -> Iterator[Problem]:
    if isinstance(fn.max_concurrency, bool) or not 1 <= fn.max_concurrency <= MAX_CONCURRENCY:
        yield f"{at}.max_concurrency", f"max_concurrency={fn.max_concurrency!r}: an int from 1 to {MAX_CONCURRENCY}"
    if fn.stream and fn.batch is not None:
        yield f"{at}.batch", STREAM_BATCH_PROBLEM


def _openai_problems(fn: FunctionSpec, at: str) -> Iterator[Problem]:
    if fn.openai and not re.fullmatch(MODEL_NAME, fn.openai):
        yield f"{at}.openai", (f"model name {fn.openai[:80]!r}: 1 to 128 letters, digits and '._:/@+-', "
                               "starting with a letter or digit")
    if fn.openai and not fn.stream and fn.input_mode != "single":
        yield f"{at}.openai", ("a model served on /openai/v1 is a generator of text pieces, a Continuous step, or a "
                               "function of one embeddings request")
    if fn.continuous is not None and (not fn.stream or fn.max_concurrency != fn.continuous.max_seqs):
        yield f"{at}.continuous", "a Continuous step streams, and runs max_seqs sequences at once"


def _tensor_problems(fn: FunctionSpec, at: str) -> Iterator[Problem]:
    assert fn.tensors is not None
    if [t.name for t in fn.tensors.inputs] != fn.params:
        yield f"{at}.inputs", "a function's input tensors are its parameters, in order"
    if [t.name for t in fn.tensors.outputs] != ["output"]:
        yield f"{at}.outputs", "a function has one output tensor, named 'output'"
    for kind, metas in (("inputs", fn.tensors.inputs), ("outputs", fn.tensors.outputs)):
        for i, meta in enumerate(metas):
            if meta.datatype and meta.datatype not in DATATYPES:
                yield f"{at}.{kind}[{i}].datatype", f"datatype {meta.datatype!r}: one of {sorted(DATATYPES)}"
            if meta.shape is not None and (len(meta.shape) > MAX_TENSOR_RANK or any(d < -1 for d in meta.shape)):
                yield f"{at}.{kind}[{i}].shape", f"a shape has at most {MAX_TENSOR_RANK} sizes, each -1 or more"


def subject_problem(subject: str, *, wildcards: bool) -> str:
    """What makes ``subject`` unusable for an app's events (``on=``, with wildcards) or results; "" if nothing."""
    tokens = subject.split(".")
    last = len(tokens) - 1
    valid = 0 < len(subject) <= MAX_SUBJECT_LENGTH and all(
        SUBJECT_TOKEN.fullmatch(t) or (wildcards and (t == "*" or (t == ">" and i == last)))
        for i, t in enumerate(tokens))
    if not valid:
        where = "wildcards '*' and a final '>'" if wildcards else "no wildcards"
        return (f"{subject!r} is not a usable NATS subject: dot-separated tokens of letters, digits, '-' and '_', "
                f"{where}, at most {MAX_SUBJECT_LENGTH} characters")
    if reserved_root(tokens[0]) or tokens[0] in ("*", ">"):
        return (f"{subject!r} reaches into a reserved namespace ({', '.join(sorted(RESERVED_SUBJECT_ROOTS))}, "
                "any root starting with '$', or a wildcard first token)")
    return ""


def reserved_root(token: str) -> bool:
    """Whether a subject starting with ``token`` belongs to Ember or the server."""
    return token in RESERVED_SUBJECT_ROOTS or token.startswith("$")


def owned_subjects(app: str) -> list[str]:
    """The subjects an app owns without any grant: ``events.<app>`` and everything under it. A token is the app's
    whole name, so ``events.team-a`` never contains app ``team-ab``'s subjects."""
    return [f"{EVENTS_ROOT}.{app}", f"{EVENTS_ROOT}.{app}.>"]


def subject_contains(outer: str, inner: str) -> bool:
    """Whether every subject that pattern ``inner`` matches is matched by pattern ``outer`` too.

    NATS wildcards: ``*`` is exactly one token, a final ``>`` one or more. ``events.a.>`` contains ``events.a.x.*``
    and ``events.a.>``, not ``events.a`` nor ``events.*.x``."""
    out, inn = outer.split("."), inner.split(".")
    for i, token in enumerate(out):
        if token == ">":
            return i < len(inn)  # '>' needs at least one token
        if i >= len(inn) or inn[i] == ">" or (token != "*" and token != inn[i]):
            return False  # a '*' of inner is any token, so only a '*' of outer contains it
    return len(out) == len(inn)


def subjects_overlap(a: str, b: str) -> bool:
    """Whether some subject is matched by both patterns (JetStream refuses two streams whose subjects overlap)."""
    ta, tb = a.split("."), b.split(".")
    for x, y in zip(ta, tb, strict=False):
        if x == ">" or y == ">":
            return True
        if x != "*" and y != "*" and x != y:
            return False
    return len(ta) == len(tb)



def _bounds(min_replicas: int, max_replicas: int, at: str) -> Iterator[Problem]:
    if not 0 <= min_replicas <= MAX_REPLICAS:
        yield f"{at}.min_replicas", f"min_replicas={min_replicas}: from 0 to {MAX_REPLICAS}"
    elif not max(min_replicas, 1) <= max_replicas <= MAX_REPLICAS:
        yield (f"{at}.max_replicas", f"max_replicas={max_replicas}: from max(min_replicas, 1) = "
                                     f"{max(min_replicas, 1)} to {MAX_REPLICAS}")


def _duplicates(names: list[str], at: str, what: str) -> Iterator[Problem]:
    seen: set[str] = set()
    for i, name in enumerate(names):
        if name in seen:
            yield f"{at}[{i}].name", f"two {what}s are named {name!r}"
        seen.add(name)
