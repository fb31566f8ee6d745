"""The secret store's pure parts: names, keys and app patterns checked, values encrypted under the key (a round
trip, and a ciphertext that holds no value), which apps may use a secret (a refusal worded as for a missing one),
the key file refused when others can read it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from cryptography.fernet import Fernet
from msgspec.structs import replace as msgspec_replace

from ember._errors import InvalidInputError, PayloadTooLargeError, UnavailableError
from ember.wire import Manifest, ServiceSpec, StoredSecret, encoder
from ember_platform.secrets.checks import check_apps, check_name, check_values, refusal, serves
from ember_platform.secrets.key import SecretsKeyError, read_key, write_key
from ember_platform.secrets.store import SecretStore


def _store(fernet: Fernet | None, apps: tuple[str, ...] = ("*",), **secrets: dict[str, str]) -> SecretStore:
    store = SecretStore(kv=None, fernet=fernet)  # type: ignore[arg-type]  # nothing here reaches the bucket
    for name, values in secrets.items():
        assert fernet is not None
        store.mirror.items[name] = StoredSecret(name=name, keys=sorted(values), apps=list(apps),
                                                ciphertext=fernet.encrypt(encoder.encode(values)).decode())
    return store


def _manifest(app: str, secret: str) -> Manifest:
    return Manifest(app=app, module="m", services=[ServiceSpec(name="f", kind="function", functions=[],
                                                               secrets=[secret])])


def _records(store: SecretStore, *names: str) -> list[StoredSecret]:
    return [store.mirror.items[n] for n in names]


def test_values_round_trip_through_fernet_and_the_ciphertext_holds_none_of_them() -> None:
    fernet = Fernet(Fernet.generate_key())
    store = _store(fernet, hf={"HF_TOKEN": "hf_abc123"}, db={"DB_URL": "postgres://x", "HF_TOKEN": "later"})
    assert store.decrypt(_records(store, "hf")) == {"HF_TOKEN": "hf_abc123"}
    assert store.decrypt(_records(store, "hf", "db")) == {"HF_TOKEN": "later", "DB_URL": "postgres://x"}  # later wins
    stored = encoder.encode(store.mirror.items["hf"])
    assert b"hf_abc123" not in stored and b"HF_TOKEN" in stored
    assert [v.name for v in store.views()] == ["db", "hf"] and b"hf_abc123" not in encoder.encode(store.views())
    assert [v.apps for v in store.views()] == [["*"], ["*"]]
    assert store.unusable("any-app", ["hf", "nope"]) == ["nope"]


def test_another_key_cannot_decrypt_and_no_key_is_a_503_naming_the_setting() -> None:
    store = _store(Fernet(Fernet.generate_key()), hf={"HF_TOKEN": "x"})
    other = SecretStore(kv=None, fernet=Fernet(Fernet.generate_key()))  # type: ignore[arg-type]
    other.mirror.items.update(store.mirror.items)
    with pytest.raises(InvalidInputError, match="another one"):
        other.decrypt(_records(other, "hf"))
    with pytest.raises(UnavailableError, match="EMBER_SECRETS_KEY_FILE"):
        _store(None).require_key()


@pytest.mark.parametrize("key", ["lower", "1ABC", "A-B", "EMBER_X", "PATH", "HOME", "PYTHONPATH", "LD_PRELOAD",
                                 "CUDA_VISIBLE_DEVICES", "A" * 129, ""])
def test_keys_ember_sets_or_that_are_no_variable_names_are_refused_by_name(key: str) -> None:
    with pytest.raises(InvalidInputError) as caught:
        check_values({key: "v"} if key else {})
    assert caught.value.field == (f"$.values.{key}" if key else "$.values")


def test_sizes_are_capped_and_names_checked() -> None:
    assert check_values({"HF_TOKEN": "x", "_A1": ""}) == {"HF_TOKEN": "x", "_A1": ""}
    with pytest.raises(PayloadTooLargeError):
        check_values({"BIG": "x" * 40_000})
    with pytest.raises(PayloadTooLargeError):
        check_values({f"K{i}": "v" for i in range(65)})
    assert check_name("hf-1") == "hf-1"
    for bad in ("HF", "-a", "a_b", "a" * 64, ""):
        with pytest.raises(InvalidInputError):
            check_name(bad)


def test_the_key_file_is_written_0600_once_and_refused_when_others_can_read_it(tmp_path: Path) -> None:
    path = write_key(tmp_path / "secrets.key")
    assert path.stat().st_mode & 0o777 == 0o600
    first = path.read_bytes()
    assert write_key(path).read_bytes() == first
    token = read_key(path).encrypt(b"v")
    assert Fernet(first.strip()).decrypt(token) == b"v"
    os.chmod(path, 0o644)
    with pytest.raises(SecretsKeyError, match="chmod 600"):
        read_key(path)
    os.chmod(path, 0o600)
    path.write_bytes(b"not a key")
    with pytest.raises(SecretsKeyError, match="no Fernet key"):
        read_key(path)
    with pytest.raises(SecretsKeyError, match="cannot read"):
        read_key(tmp_path / "missing")


def test_a_secret_serves_only_the_apps_its_patterns_match_and_one_without_patterns_serves_none() -> None:
    store = _store(Fernet(Fernet.generate_key()), ("team-b-*", "shared"), db={"DB_URL": "x"})
    assert store.unusable("team-b-x", ["db"]) == [] and store.unusable("shared", ["db"]) == []
    assert store.unusable("tenant-x", ["db"]) == ["db"] and store.unusable("team-a-x", ["db"]) == ["db"]
    legacy = StoredSecret(name="old", keys=["K"], ciphertext="")  # stored before secrets had app patterns
    assert not serves(legacy, "old") and not serves(None, "any")
    assert serves(msgspec_replace(legacy, apps=["*"]), "any")


def test_a_refusal_reads_as_a_missing_secret_except_to_an_admin() -> None:
    store = _store(Fernet(Fernet.generate_key()), ("team-b-*",), db={"DB_URL": "x"})
    store.mirror.items["old"] = StoredSecret(name="old", keys=["K"], ciphertext="")

    def refused(app: str, name: str, admin: bool) -> InvalidInputError:
        with pytest.raises(InvalidInputError) as caught:
            store.check_declared(app, _manifest(app, name), admin=admin)
        assert caught.value.field == "$.manifest.services[0].secrets[0]"
        return caught.value

    for name in ("db", "nope", "old"):  # not for this app, missing, without patterns: the same words
        assert refused("tenant-x", name, False).message == refusal(name, "tenant-x")
    assert "does not exist for app 'tenant-x'" in refusal("db", "tenant-x") and "team-b" not in refusal("db", "x")
    assert "team-b-*" in refused("tenant-x", "db", True).message  # an admin may list them all anyway
    legacy = refused("tenant-x", "old", True).message
    assert "no app patterns" in legacy and "--apps" in legacy and legacy == refusal("old", "tenant-x",
                                                                                    store.mirror.items["old"])
    store.check_declared("team-b-x", _manifest("team-b-x", "db"))  # the owner's app: no error


@pytest.mark.parametrize(("apps", "field"), [(None, "$.apps"), ([], "$.apps"), (["Team"], "$.apps[0]"),
                                             (["ok", "a b"], "$.apps[1]"), (["x" * 64], "$.apps[0]"),
                                             (["a"] * 101, "$.apps")])
def test_app_patterns_are_required_and_checked_by_field(apps: list[str] | None, field: str) -> None:
    with pytest.raises(InvalidInputError) as caught:
        check_apps(apps)
    assert caught.value.field == field
    if apps is None:
        assert "'*' for every app" in caught.value.message


def test_app_patterns_keep_their_order_once_each() -> None:
    assert check_apps(["team-b-*", "*", "team-b-*", "x?"]) == ["team-b-*", "*", "x?"]
