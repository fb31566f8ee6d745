"""``ember.Image``: what it accepts, what it refuses and why; where it lands in the manifest; the lenient import
that lets a machine without an image's packages read an app's images."""

from __future__ import annotations

import subprocess
import sys

import msgspec
import pytest

import ember
from ember._plan import ImagePlan
from ember.wire.images import ImageSpec, image_hash, image_problems, lock_pins, same_declaration
from ember.wire.validate import manifest_problems


def test_an_image_is_plain_data_that_grows_by_returning_new_images():
    base = ember.Image(python="3.11")
    grown = base.pip_install("humanize==4.9.0", ["numpy>=1.26,<3", "torch[cuda]~=2.4"]).env({"HF_HUB_OFFLINE": "1"})
    assert base.spec.packages == [] and base.spec.env == {}
    assert grown.spec.packages == ["humanize==4.9.0", "numpy>=1.26,<3", "torch[cuda]~=2.4"]
    assert grown.spec.env == {"HF_HUB_OFFLINE": "1"} and grown.spec.python == "3.11"
    assert grown == base.pip_install("humanize==4.9.0", "numpy>=1.26,<3", "torch[cuda]~=2.4").env(
        {"HF_HUB_OFFLINE": "1"})


@pytest.mark.parametrize("spec", [
    "emberprobe @ file:///etc/passwd", "https://evil.example/x.whl", "../outside", "/abs/path", "./here",
    "-e .", "--index-url=https://evil", "x --extra-index-url https://evil", "~/pkg", "pkg\\..\\x", "",
    "a" * 300, "pkg==1.0\nother", "ember", "ember-runtime==1", "git+https://github.com/x/y",
])
def test_a_package_spec_is_a_name_and_a_version_never_a_url_a_path_or_an_option(spec):
    with pytest.raises(ember.InvalidSpecError):
        ember.Image().pip_install(spec)


@pytest.mark.parametrize(("variables", "says"), [
    ({"A=B": "1"}, "no '='"), ({"A\x00B": "1"}, "no NUL"), ({"1A": "x"}, "not starting with a digit"),
    ({"HF_TOKEN": "hf_x"}, "secrets="), ({"DB_PASSWORD": "x"}, "secret"), ({"OPENAI_API_KEY": "x"}, "secret"),
    ({"PYTHONPATH": "/x"}, "Ember itself"), ({"LD_PRELOAD": "/x.so"}, "Ember itself"),
    ({"EMBER_DEVICE": "cuda"}, "Ember itself"), ({"OK": "a\x00b"}, "without NUL"), ({"OK": 1}, "string"),
])
def test_environment_variables_are_checked_and_credentials_are_sent_to_secrets(variables, says):
    with pytest.raises(ember.InvalidSpecError, match=says):
        ember.Image().env(variables)


@pytest.mark.parametrize("kwargs", [
    {"python": "2.7"}, {"python": "../3.11"}, {"index_url": "ftp://x"}, {"extra_index_urls": ["file:///etc"]},
    {"find_links": ["relative/dir"]}, {"find_links": ["/srv/../etc"]}, {"extra_index_urls": "https://x"},
    {"no_index": True}, {"index_url": "http://169.254.169.254/latest/meta-data/"},
    {"extra_index_urls": ["http://metadata.google.internal/computeMetadata/v1/"]}, {"find_links": ["http://[fe80::1]/"]},
])
def test_indexes_and_python_are_checked(kwargs):
    with pytest.raises(ember.InvalidSpecError):
        ember.Image(**kwargs)


@pytest.mark.parametrize("url", ["https://__token__:glpat-SECRET@gitlab.example/simple", "https://SECRET@x.example/",
                                 "https://user:@x.example/simple"])
def test_an_index_url_with_credentials_is_refused_without_quoting_them(url):
    for kwargs in ({"index_url": url}, {"extra_index_urls": [url]}, {"find_links": [url]}):
        with pytest.raises(ember.InvalidSpecError, match="credentials") as refused:
            ember.Image(**kwargs)
        assert "SECRET" not in str(refused.value) and "glpat" not in str(refused.value)


def test_requirements_files_are_read_beside_the_caller_and_checked_line_by_line(tmp_path, monkeypatch):
    (tmp_path / "requirements.txt").write_text("# pins\nhumanize==4.9.0  # for reports\n\nnumpy>=1.26\n")
    image = ember.Image().requirements(tmp_path / "requirements.txt")
    assert image.spec.packages == ["humanize==4.9.0", "numpy>=1.26"]
    (tmp_path / "bad.txt").write_text("humanize\n-e ../elsewhere\n")
    with pytest.raises(ember.InvalidSpecError, match="line 2"):
        ember.Image().requirements(tmp_path / "bad.txt")
    (tmp_path / "url.txt").write_text("pkg @ https://evil.example/pkg.whl\n")
    with pytest.raises(ember.InvalidSpecError, match="not a URL"):
        ember.Image().requirements(tmp_path / "url.txt")
    with pytest.raises(ember.InvalidSpecError, match="cannot read"):
        ember.Image().requirements(tmp_path / "absent.txt")


def test_the_apps_image_applies_to_its_services_unless_one_names_its_own():
    base = ember.Image().pip_install("humanize==4.9.0")
    other = ember.Image().pip_install("numpy==2.1.0")
    app = ember.App("imaged", image=base)

    @app.function()
    def plain() -> int:
        return 1

    @app.function(image=other)
    def own() -> int:
        return 2

    @app.model(image=other)
    class Model:
        @ember.method
        def go(self) -> int:
            return 3

    services = {s.name: s for s in app.manifest("m").services}
    assert services["plain"].image == base.spec
    assert services["own"].image == services["Model"].image == other.spec
    assert ember.App("bare").image is None
    with pytest.raises(ember.InvalidSpecError, match=r"an ember\.Image"):
        ember.App("x", image="humanize")  # type: ignore[arg-type]
    with pytest.raises(ember.InvalidSpecError, match=r"an ember\.Image"):
        app.function(image=["humanize"])  # type: ignore[arg-type]


def test_a_lock_names_its_environment_and_a_forged_one_is_refused():
    locked = ImageSpec(python="3.11", packages=["x==1"], lock="x==1 \\\n    --hash=sha256:ab\n")
    locked = msgspec.structs.replace(locked, sha256=image_hash(locked))
    assert list(image_problems(locked, "$")) == []
    assert lock_pins(locked.lock) == {"x": "1"}
    # the environment variables do not name the environment: they are set at start, not installed
    assert image_hash(msgspec.structs.replace(locked, env={"A": "1"})) == locked.sha256
    assert image_hash(msgspec.structs.replace(locked, lock="x==2\n")) != locked.sha256
    for forged in (msgspec.structs.replace(locked, sha256="../../etc/passwd"),
                   msgspec.structs.replace(locked, sha256="0" * 64),
                   msgspec.structs.replace(locked, lock="x @ file:///etc/passwd\n"),
                   msgspec.structs.replace(locked, lock="--index-url https://evil\nx==1\n")):
        assert list(image_problems(forged, "$")), forged


def test_the_platform_checks_images_in_every_manifest():
    app = ember.App("checked", image=ember.Image().pip_install("humanize"))

    @app.function()
    def f() -> int:
        return 1

    manifest = app.manifest("m")
    bad = msgspec.structs.replace(manifest, services=[msgspec.structs.replace(
        manifest.services[0], image=ImageSpec(packages=["x @ https://evil"], env={"A=B": "1"}))])
    fields = [field for field, _ in manifest_problems(bad, "$.manifest")]
    assert "$.manifest.services[0].image.packages[0]" in fields and "$.manifest.services[0].image.env" in fields


APP_WITHOUT_ITS_PACKAGES = """
import ember
import not_installed_anywhere as nia
from not_installed_anywhere.sub import Thing, decorate

image = ember.Image().pip_install("not-installed-anywhere==1.0")
app = ember.App("lenient", image=image)


class Model(Thing):
    pass


@decorate
def helper():
    return nia.value


@app.function()
def f(x: int) -> int:
    return nia.compute(x)
"""


def test_an_app_importing_packages_this_machine_lacks_still_declares_its_images(tmp_path):
    path = tmp_path / "lenient_app.py"
    path.write_text(APP_WITHOUT_ITS_PACKAGES)
    done = subprocess.run([sys.executable, "-m", "ember._inspect", "--images", str(path)], capture_output=True,
                          check=False, cwd=tmp_path)
    assert done.returncode == 0, done.stderr.decode()
    found = msgspec.json.decode(done.stdout, type=ImagePlan)
    assert found.app == "lenient" and found.module == "lenient_app" and found.missing == ["not_installed_anywhere"]
    assert found.images[0].packages == ["not-installed-anywhere==1.0"] and found.manifest is None
    # the strict import (what replicas and the platform-side inspection do) still fails, naming the module
    strict = subprocess.run([sys.executable, "-m", "ember._inspect", str(path)], capture_output=True, check=False,
                            cwd=tmp_path)
    assert strict.returncode != 0 and b"not_installed_anywhere" in strict.stderr


def test_the_stand_ins_leave_the_standard_library_and_ember_alone(tmp_path):
    for missing in ("json.no_such_module", "ember.no_such_module"):
        path = tmp_path / "typo_app.py"
        path.write_text(f"import ember\nimport {missing}\napp = ember.App('typo')\n")
        done = subprocess.run([sys.executable, "-m", "ember._inspect", "--images", str(path)], capture_output=True,
                              check=False, cwd=tmp_path)
        assert done.returncode != 0 and missing.encode() in done.stderr  # a real error, not a stand-in


def test_a_lock_is_of_a_declaration_when_all_but_the_lock_and_variables_agree():
    declared = ember.Image(find_links=["https://wheels.example/"]).pip_install("x>=1").spec
    locked = msgspec.structs.replace(declared, python="3.11", lock="x==1.2 \\\n    --hash=sha256:ab\n", env={"A": "1"})
    locked = msgspec.structs.replace(locked, sha256=image_hash(locked))
    assert same_declaration(declared, locked)  # no Python named: the node's, as locked
    assert same_declaration(msgspec.structs.replace(declared, env={"B": "2"}), locked)  # variables are not installed
    assert not same_declaration(ember.Image(python="3.12").pip_install("x>=1").spec, locked)
    assert not same_declaration(ember.Image().pip_install("x>=1", "y").spec, locked)
    assert not same_declaration(declared, msgspec.structs.replace(locked, lock="", sha256=""))
