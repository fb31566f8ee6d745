"""The secret store's pure parts: names and keys checked, values encrypted under the key (a round trip, and a
ciphertext that holds no value), the key file refused when others can read it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from cryptography.fernet import Fernet

from ember._errors import InvalidInputError, NotFoundError, PayloadTooLargeError, UnavailableError
from ember.wire import StoredSecret, encoder
from ember_platform.secrets.checks import check_name, check_values
from ember_platform.secrets.key import SecretsKeyError, read_key, write_key
from ember_platform.secrets.store import SecretStore


def _store(fernet: Fernet | None, **secrets: dict[str, str]) -> SecretStore:
    store = SecretStore(kv=None, fernet=fernet)  # type: ignore[arg-type]  # nothing here reaches the bucket
    for name, values in secrets.items():
        assert fernet is not None
        store.mirror.items[name] = StoredSecret(name=name, keys=sorted(values),
                                                ciphertext=fernet.encrypt(encoder.encode(values)).decode())
    return store


def test_values_round_trip_through_fernet_and_the_ciphertext_holds_none_of_them() -> None:
    fernet = Fernet(Fernet.generate_key())
    store = _store(fernet, hf={"HF_TOKEN": "hf_abc123"}, db={"DB_URL": "postgres://x", "HF_TOKEN": "later"})
    assert store.env(["hf"]) == {"HF_TOKEN": "hf_abc123"}
    assert store.env(["hf", "db"]) == {"HF_TOKEN": "later", "DB_URL": "postgres://x"}  # a later one wins
    stored = encoder.encode(store.mirror.items["hf"])
    assert b"hf_abc123" not in stored and b"HF_TOKEN" in stored
    assert [v.name for v in store.views()] == ["db", "hf"] and b"hf_abc123" not in encoder.encode(store.views())
    assert store.missing(["hf", "nope"]) == ["nope"]
    with pytest.raises(NotFoundError, match="nope"):
        store.env(["nope"])


def test_another_key_cannot_decrypt_and_no_key_is_a_503_naming_the_setting() -> None:
    store = _store(Fernet(Fernet.generate_key()), hf={"HF_TOKEN": "x"})
    other = SecretStore(kv=None, fernet=Fernet(Fernet.generate_key()))  # type: ignore[arg-type]
    other.mirror.items.update(store.mirror.items)
    with pytest.raises(InvalidInputError, match="another one"):
        other.env(["hf"])
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
