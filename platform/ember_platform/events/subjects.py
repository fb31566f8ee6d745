"""Who may bind which event subjects: pure checks of a manifest against the grants and the other apps' bindings.

An app owns ``events.<app>`` and everything under it; an admin may grant it more (``ember subject grant``). Its
functions' ``on=`` patterns and ``result_subject`` must lie inside what it owns or was granted, so that no tenant
reads another's events (binding them) or feeds another's consumers (publishing results on their subjects). Two
apps never bind overlapping subjects: JetStream refuses two streams whose subjects overlap, and a message would
otherwise go to whichever stream took the subject first. The refusal says neither which app holds a subject nor
that one exists beyond this: a conflict.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from fnmatch import fnmatchcase

from ember._errors import ConflictError, InvalidInputError
from ember.wire import Deployment, Manifest
from ember.wire.grants import SubjectGrant
from ember.wire.validate import owned_subjects, subject_contains, subjects_overlap
from ember_platform.auth.scopes import Principal

Binding = tuple[str, str]  # (JSON path of the field, subject pattern)


def granted(app: str, grant: SubjectGrant) -> bool:
    """Whether ``grant`` covers ``app`` (one of its app patterns matches the name, as a token's patterns do)."""
    return any(p == app or fnmatchcase(app, p) for p in grant.apps)


def allowed_patterns(app: str, grants: Iterable[SubjectGrant]) -> list[str]:
    """The patterns inside which ``app`` may bind subjects: its own, then those granted to it."""
    return owned_subjects(app) + sorted(g.pattern for g in grants if granted(app, g))


def bindings(manifest: Manifest, at: str = "$.manifest") -> Iterator[Binding]:
    """Every ``on=`` pattern and ``result_subject`` of ``manifest``, with the field that declares it."""
    for i, service in enumerate(manifest.services):
        for j, fn in enumerate(service.functions):
            where = f"{at}.services[{i}].functions[{j}]"
            for k, subject in enumerate(fn.on):
                yield f"{where}.on[{k}]", subject
            if fn.result_subject is not None:
                yield f"{where}.result_subject", fn.result_subject


def check_bindings(manifest: Manifest, grants: Iterable[SubjectGrant], deployments: Mapping[str, Deployment]) -> None:
    """What a push's subjects must satisfy (``POST /v1/apps/<app>/deployments``): owned or granted (422), and
    overlapping no other app's (409)."""
    check_ownership(manifest, grants)
    check_overlap(manifest, deployments)


def check_ownership(manifest: Manifest, grants: Iterable[SubjectGrant]) -> None:
    """422 naming the first subject of ``manifest`` outside what its app owns or was granted."""
    allowed = allowed_patterns(manifest.app, grants)
    for field, subject in bindings(manifest):
        if not any(subject_contains(pattern, subject) for pattern in allowed):
            raise InvalidInputError(
                f"subject {subject[:300]!r} is outside what app {manifest.app!r} may bind: its own "
                f"{' and '.join(owned_subjects(manifest.app))}, and what an admin granted it "
                f"({', '.join(allowed[2:]) or 'nothing yet'}); an admin grants more with "
                f"`ember subject grant 'PATTERN' --apps '{manifest.app}'`", field=field)


def check_overlap(manifest: Manifest, deployments: Mapping[str, Deployment]) -> None:
    """The ``on=`` patterns of ``manifest`` overlap neither each other (422 naming the field) nor any other
    deployed app's (409, naming neither the app nor its subject)."""
    own = [(field, s) for field, s in bindings(manifest) if not field.endswith(".result_subject")]
    for n, (field, subject) in enumerate(own):
        if any(subjects_overlap(subject, other) for _, other in own[:n]):
            raise InvalidInputError(f"subject {subject[:300]!r} overlaps another of this app's on= subjects; one "
                                    "subject goes to one function", field=field)
    taken = [s for app, dep in deployments.items() if app != manifest.app for s in _on(dep.manifest)]
    for field, subject in own:
        if any(subjects_overlap(subject, other) for other in taken):
            raise ConflictError(f"subject {subject[:300]!r} overlaps subjects another app binds; two apps never bind "
                                "overlapping subjects: bind a narrower one, or ask an admin which to use", field=field)


def bound_subjects(deployments: Mapping[str, Deployment], principal: Principal) -> list[str]:
    """The ``on=`` patterns of every deployed app ``principal`` sees: where an ``events`` client of that token may
    publish."""
    return sorted({s for app, dep in deployments.items() if principal.sees(app) for s in _on(dep.manifest)})


def result_subjects(deployments: Mapping[str, Deployment], principal: Principal) -> list[str]:
    """The ``result_subject`` of every function of the deployed apps ``principal`` sees: what an ``events`` client
    of that token may subscribe to."""
    return sorted({fn.result_subject for app, dep in deployments.items() if principal.sees(app)
                   for svc in dep.manifest.services for fn in svc.functions if fn.result_subject})


def _on(manifest: Manifest) -> list[str]:
    return [s for svc in manifest.services for fn in svc.functions for s in fn.on]
