"""The Keras and TensorFlow versions tfdist supports, and the refusal of any other.

Supported: Keras 3.14 through 3.16 (3.16's development builds, `keras-nightly`,
included; the builds the tests pin are in `constraints-compat.txt`) and
TensorFlow 2.18 through 2.22 (2.22's release candidate included: it brings
the Keras 3.16 development build), as `pyproject.toml` declares. tfdist patches
Keras internals (`tfdist.strategies.keras_patches`) whose behaviour differs
between minor versions - Keras 3.12 and 3.13 do not divide activity-regularizer
losses by the batch size as 3.14 does, which tfdist's loss weighting reads -
so a version outside the range would train silently wrong: it is refused
with an ImportError naming the range, when tfdist is imported (from the
installed packages' metadata, without importing either) and again when the
strategies are (from the imported modules' `__version__`).
`TFDIST_ALLOW_UNTESTED_VERSIONS=1` turns the refusal into a warning, for
whoever tries a new release on purpose.
"""

import importlib.util
import logging
import os
import re
from typing import Optional, Tuple

from tfdist import env_vars

# [lowest, highest) major.minor, as pyproject.toml's dependencies say.
SUPPORTED = {
    "keras": ((3, 14), (3, 17)),
    "tensorflow": ((2, 18), (2, 23)),
}
# The distributions that install each module (development builds have their own names).
DISTRIBUTIONS = {
    "keras": ("keras", "keras-nightly"),
    "tensorflow": ("tensorflow", "tensorflow-cpu", "tensorflow-intel", "tensorflow-macos",
                   "tf-nightly", "tf-nightly-cpu"),
}
_warned = set()  # (module, version) already warned about

PIP_REQUIREMENT = {"keras": "keras>=3.14,<3.17", "tensorflow": "tensorflow>=2.18,<2.23"}


INSTALL_HINT = ("Install tfdist with the extra that brings TensorFlow: pip install "
                "'/path/to/tfdist[cpu]' (tensorflow-cpu) or '/path/to/tfdist[tf]' (tensorflow, "
                "with GPU support), from a clone or as 'tfdist[cpu] @ git+URL'; or install "
                "TensorFlow yourself: pip install 'tensorflow>=2.18,<2.23'.")


def require_tensorflow() -> None:
    """A `ModuleNotFoundError` that names the install extra when TensorFlow or Keras is missing.

    `import tfdist` and the launcher need neither; everything that trains
    does, and a bare "No module named 'tensorflow'" does not say that
    tfdist installs TensorFlow only through an extra.
    """
    for module in ("tensorflow", "keras"):
        try:
            missing = importlib.util.find_spec(module) is None
        except (ImportError, ValueError):
            missing = True
        if missing:
            raise ModuleNotFoundError(
                f"tfdist needs TensorFlow {describe_range('tensorflow')} with Keras "
                f"{describe_range('keras')}, and this Python has no {module!r} module. "
                + INSTALL_HINT, name=module)


class UnsupportedVersion(ImportError):
    """A Keras or TensorFlow outside the range tfdist is tested with."""


def major_minor(version: str) -> Optional[Tuple[int, int]]:
    """(major, minor) of a version string ("3.16.0.dev2026102704" -> (3, 16)); None if none."""
    match = re.match(r"\s*(\d+)\.(\d+)", version or "")
    return (int(match.group(1)), int(match.group(2))) if match else None


def describe_range(module: str) -> str:
    (low_major, low_minor), (high_major, high_minor) = SUPPORTED[module]
    return f"{low_major}.{low_minor} to {high_major}.{high_minor - 1}"


def refuse_unsupported(module: str, version: str, tfdist_version: str = "") -> None:
    """UnsupportedVersion if `module` ("keras" or "tensorflow") at `version` is outside the
    supported range (a warning instead under TFDIST_ALLOW_UNTESTED_VERSIONS=1)."""
    parsed = major_minor(version)
    low, high = SUPPORTED[module]
    if parsed is None or low <= parsed < high:
        return
    name = {"keras": "Keras", "tensorflow": "TensorFlow"}[module]
    message = (f"tfdist {tfdist_version} supports {name} {describe_range(module)}"
               f"{' (development builds of 3.16 included)' if module == 'keras' else ''}; "
               f"{name} {version} is installed. Install a supported version "
               f"(pip install '{PIP_REQUIREMENT[module]}'), or set "
               f"{env_vars.ALLOW_UNTESTED_VERSIONS}=1 to try this one untested.")
    if env_vars.ALLOW_UNTESTED_VERSIONS.flag():
        if (module, version) not in _warned:  # once, though checked at import and at the check
            _warned.add((module, version))
            logging.getLogger("tfdist").warning("%s (%s=1: going on untested)", message,
                                                env_vars.ALLOW_UNTESTED_VERSIONS)
        return
    raise UnsupportedVersion(message)


def installed_version(module: str) -> Optional[str]:
    """The version of the distribution that installed `module`, read from its metadata next to
    the module (no import); None when it cannot be told (then the import-time check decides)."""
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    site = os.path.dirname(list(spec.submodule_search_locations)[0])
    try:
        entries = os.listdir(site)
    except OSError:
        return None
    for distribution in DISTRIBUTIONS[module]:
        prefix = distribution.replace("-", "_") + "-"
        for entry in entries:
            if entry.startswith(prefix) and entry.endswith(".dist-info"):
                if _top_level_is(os.path.join(site, entry), module):
                    return entry[len(prefix):-len(".dist-info")]
    return None


def _top_level_is(dist_info: str, module: str) -> bool:
    """True if the distribution at `dist_info` installs `module` (its RECORD lists it)."""
    try:
        with open(os.path.join(dist_info, "RECORD"), encoding="utf-8") as record:
            return any(line.startswith(module + "/") for line in record)
    except OSError:
        return True  # no RECORD: trust the name


def check_installed(tfdist_version: str = "") -> None:
    """Refuse an installed Keras or TensorFlow outside the range, before either is imported."""
    for module in SUPPORTED:
        version = installed_version(module)
        if version is not None:
            refuse_unsupported(module, version, tfdist_version)
