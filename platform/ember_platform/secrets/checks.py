"""What a secret may be and which apps may use it: pure checks of its name, values and app patterns (422 naming
the field, 413 when too large), and the refusal of an app that declares a secret it may not use."""

from __future__ import annotations

from fnmatch import fnmatchcase

from ember._errors import InvalidInputError, PayloadTooLargeError
from ember.wire.secrets import MAX_SECRET_BYTES, MAX_SECRET_KEYS, StoredSecret, key_problem, name_problem
from ember_platform.auth.scopes import APP_PATTERN, MAX_PATTERNS


def check_name(name: str, field: str = "$.name") -> str:
    problem = name_problem(name)
    if problem:
        raise InvalidInputError(problem, field=field)
    return name


def check_values(values: dict[str, str]) -> dict[str, str]:
    """``values`` if every key is an environment variable a secret may set and they fit; else the error."""
    if not values:
        raise InvalidInputError("a secret holds at least one KEY=VALUE", field="$.values")
    if len(values) > MAX_SECRET_KEYS:
        raise PayloadTooLargeError(f"a secret holds at most {MAX_SECRET_KEYS} keys, not {len(values)}")
    for key, value in values.items():
        problem = key_problem(key)
        if problem:
            raise InvalidInputError(problem, field=f"$.values.{key[:130]}")
        if "\x00" in value:
            raise InvalidInputError(f"the value of {key} holds a NUL character, which no environment variable can",
                                    field=f"$.values.{key}")
    size = sum(len(k.encode()) + len(v.encode()) for k, v in values.items())
    if size > MAX_SECRET_BYTES:
        raise PayloadTooLargeError(f"a secret's keys and values hold at most {MAX_SECRET_BYTES} bytes, not {size}")
    return values


def check_apps(apps: list[str] | None) -> list[str]:
    """The app patterns of a secret (the token pattern syntax), unique and in order; required, so that a secret is
    never every app's by accident."""
    if not apps or len(apps) > MAX_PATTERNS:
        raise InvalidInputError(f"apps: give the app patterns whose apps may use this secret ('team-b-*', 1 to "
                                f"{MAX_PATTERNS}; '*' for every app)", field="$.apps")
    for i, pattern in enumerate(apps):
        if not isinstance(pattern, str) or not APP_PATTERN.fullmatch(pattern):
            shown = str(pattern)[:80]
            raise InvalidInputError(f"app pattern {shown!r}: 1 to 63 of lowercase letters, digits, '-' and the globs "
                                    "'*' and '?'", field=f"$.apps[{i}]")
    return list(dict.fromkeys(apps))


def serves(stored: StoredSecret | None, app: str) -> bool:
    """Whether ``app`` may use the secret ``stored`` (None: there is none): one of its patterns matches the app's
    name. A secret stored before secrets had patterns has none, and serves no app."""
    return stored is not None and any(p == app or fnmatchcase(app, p) for p in stored.apps)


def refusal(name: str, app: str, stored: StoredSecret | None = None) -> str:
    """Why ``app`` may not use the secret ``name``. Without ``stored`` (for anyone but an admin) the words of a
    secret that does not exist, whether it does or not; with it (an admin, who may list them all anyway) the real
    reason."""
    if stored is not None and not stored.apps:
        return (f"secret {name!r} has no app patterns (it was set before secrets had them), so no app may use it: "
                f"set it again with --apps (`ember secret set {name} --apps {app} KEY=VALUE`)")
    if stored is not None:
        return (f"secret {name!r} is for apps {', '.join(stored.apps)}, not {app!r}: set it again with --apps to "
                f"add this app (`ember secret set {name} --apps ... KEY=VALUE`)")
    return (f"secret {name!r} does not exist for app {app!r}: an admin sets it for this app first (`ember secret "
            f"set {name} --apps {app} KEY=VALUE`; `ember secret ls` lists them)")
