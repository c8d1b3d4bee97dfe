"""The supported Keras and TensorFlow range: refused outside it, at import (`tfdist.versions`)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tfdist import versions

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("version, parsed", [
    ("3.15.1", (3, 15)), ("3.16.0.dev2026102704", (3, 16)), ("2.21.0", (2, 21)),
    ("3.14.0rc1", (3, 14)), ("nightly", None)])
def test_versions_are_read_as_major_minor(version, parsed):
    assert versions.major_minor(version) == parsed


@pytest.mark.parametrize("module, version", [
    ("keras", "3.14.0"), ("keras", "3.15.1"), ("keras", "3.16.0.dev2026102704"),
    ("keras", "3.16.2"), ("tensorflow", "2.18.1"), ("tensorflow", "2.21.0"),
    ("tensorflow", "2.22.0rc0"), ("tensorflow", "2.22.0")])
def test_supported_versions_pass(module, version, monkeypatch):
    monkeypatch.delenv("TFDIST_ALLOW_UNTESTED_VERSIONS", raising=False)
    versions.refuse_unsupported(module, version)


@pytest.mark.parametrize("module, version, named", [
    ("keras", "3.12.4", "Keras 3.14 to 3.16"), ("keras", "3.13.2", "Keras 3.14 to 3.16"),
    ("keras", "3.17.0.dev2027010100", "Keras 3.14 to 3.16"), ("keras", "3.5.0", "Keras 3.14 to 3.16"),
    ("tensorflow", "2.17.1", "TensorFlow 2.18 to 2.22"),
    ("tensorflow", "2.23.0", "TensorFlow 2.18 to 2.22"),
    ("tensorflow", "2.23.0rc0", "TensorFlow 2.18 to 2.22")])
def test_a_version_outside_the_range_is_refused_naming_the_range(module, version, named,
                                                                   monkeypatch):
    monkeypatch.delenv("TFDIST_ALLOW_UNTESTED_VERSIONS", raising=False)
    with pytest.raises(ImportError) as refusal:
        versions.refuse_unsupported(module, version, "0.1.0")
    message = str(refusal.value)
    assert f"supports {named}" in message and f"{version} is installed" in message
    assert "pip install '" in message and "TFDIST_ALLOW_UNTESTED_VERSIONS=1" in message


def test_the_refusal_can_be_turned_into_a_warning(monkeypatch, caplog):
    monkeypatch.setenv("TFDIST_ALLOW_UNTESTED_VERSIONS", "1")
    versions.refuse_unsupported("keras", "3.12.1")  # warned once however often checked
    versions.refuse_unsupported("keras", "3.12.1")
    assert caplog.text.count("going on untested") == 1


def _fake_site(root, distribution, version, module="keras"):
    """A site-packages folder with `module` installed by `distribution` at `version`."""
    (root / module).mkdir(parents=True)
    (root / module / "__init__.py").write_text("raise RuntimeError('imported')\n")
    info = root / f"{distribution.replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    (info / "RECORD").write_text(f"{module}/__init__.py,,\n")
    return root


def _python(code, site):
    environment = dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), str(REPO)]))
    environment.pop("TFDIST_ALLOW_UNTESTED_VERSIONS", None)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, env=environment, check=False)


@pytest.mark.launches  # a Python process (no training)
def test_the_installed_version_is_read_from_the_metadata_without_importing(tmp_path):
    """A development build is installed by keras-nightly; its package is not imported."""
    site = _fake_site(tmp_path, "keras-nightly", "3.16.0.dev2026102704")
    result = _python("import sys, tfdist; from tfdist import versions; "
                     "print(versions.installed_version('keras'), 'keras' in sys.modules)", site)
    assert result.stdout.split() == ["3.16.0.dev2026102704", "False"], result.stderr[-2000:]


@pytest.mark.launches  # a Python process (no training)
def test_importing_tfdist_refuses_a_keras_outside_the_range(tmp_path):
    """Keras 3.12 trains activity regularizers differently: `import tfdist` says so."""
    result = _python("import tfdist", _fake_site(tmp_path, "keras", "3.12.4"))
    assert result.returncode == 1
    assert "UnsupportedVersion: tfdist 0.1.0 supports Keras 3.14 to 3.16" in result.stderr
    assert "Keras 3.12.4 is installed" in result.stderr
