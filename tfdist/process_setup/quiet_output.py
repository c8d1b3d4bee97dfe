"""Quiet output under every launcher: what tfdist-run's filter does, done inside each process.

tfdist-run relays its processes' output through `tfdist.launch.output_filter`
(TensorFlow's start-up notices dropped, each distinct warning printed once for
the job). Under mpirun, srun, horovodrun, Ray Train or a Kubernetes Job the
launcher prints every rank's output as it comes, so each process keeps its own
quiet:

1. TensorFlow's start-up notices (`tfdist.process_setup.startup_notices`) are printed on
   stderr while TensorFlow is imported. When `tfdist` is imported before
   TensorFlow (`import tfdist` above `import keras`), `before_tensorflow`
   sets TF_CPP_MIN_LOG_LEVEL=1 (TensorFlow's info lines off, its warnings
   and errors kept) unless the user set it, and has TensorFlow's import run
   with stderr (file descriptor 2) sent to a temporary file whose lines,
   start-up notices left out, are written back to stderr once the import
   returns: the oneDNN notice and absl's pre-initialization warning ignore
   TF_CPP_MIN_LOG_LEVEL. A user's TF_CPP_MIN_LOG_LEVEL=0 keeps every notice.
   Imported after TensorFlow, it is too late: export TF_CPP_MIN_LOG_LEVEL=1
   in the job (`srun --export=ALL,TF_CPP_MIN_LOG_LEVEL=1`, `mpirun -x
   TF_CPP_MIN_LOG_LEVEL=1`), which leaves the oneDNN notice.
2. Python warnings raised in library code (Keras, TensorFlow, NumPy, absl,
   tfdist) are the same on every rank, since every rank runs the same script:
   `after_discovery` has only rank 0 show them. Warnings attributed to the
   user's own modules show on every rank. What this gives up: a library
   warning that only another rank raises (its slice ran out of data) is not
   shown - tfdist-run's filter, which sees every rank's output, shows it.

A single process started without a launcher (`python train.py`, tfdist
imported before TensorFlow) gets 1. without the log level: TensorFlow prints
those notices twice there (once per shared library), and they say nothing
about the job. Nothing changes under tfdist-run (its filter does this across
ranks) or with TFDIST_VERBOSE=1 (or TF_CPP_MIN_LOG_LEVEL=0). Cost: one environment check at
import, TensorFlow's import output held until the import returns (what the
process prints on stderr while importing TensorFlow is lost if the process
dies inside that import), and one warnings filter per process.
"""

import contextlib
import importlib.abc
import importlib.util
import os
import sys
import tempfile
import warnings

from tfdist.env_vars import Foreign
from tfdist import env_vars
from tfdist.process_setup.startup_notices import NoticeDropper

LIBRARY_MODULES = r"(keras|tensorflow|tf_keras|numpy|absl|tfdist)(\.|$)"
# Launchers whose output tfdist does not relay (tfdist-run filters its own).
UNFILTERED_LAUNCHERS = ("horovodrun", Foreign.TF_CONFIG.name, "mpirun", "srun", "kubernetes")


def verbose(environ=None):
    return env_vars.VERBOSE.flag(environ)


def _discovered(environ):
    """This process's job as its launcher's environment describes it, or None if malformed
    (reported when a strategy discovers the cluster)."""
    from tfdist.process_setup import cluster as cluster_lib  # pylint: disable=import-outside-toplevel

    try:
        return cluster_lib.discover(environ)
    except ValueError:
        return None


def _unfiltered_job(spec):
    return spec.launcher in UNFILTERED_LAUNCHERS and (spec.world_size > 1 or spec.is_server)


def _single_process(spec):
    """A plain `python train.py`: no launcher's environment (one process, not a server)."""
    return spec.world_size == 1 and not spec.is_server and spec.launcher == "single"


def before_tensorflow(environ=None, modules=None, meta_path=None):
    """At `import tfdist`: TensorFlow's start-up notices off in a multi-process job, if still
    possible (see the module docstring).

    Returns True when it set TF_CPP_MIN_LOG_LEVEL.
    """
    environ = os.environ if environ is None else environ
    modules = sys.modules if modules is None else modules
    meta_path = sys.meta_path if meta_path is None else meta_path
    spec = None if "tensorflow" in modules or verbose(environ) else _discovered(environ)
    if spec is None:
        return False
    if _single_process(spec):  # no level changed: only the notices held and left out
        if Foreign.TF_CPP_MIN_LOG_LEVEL.get(environ) != "0":
            _hold_import(meta_path)
        return False
    if not _unfiltered_job(spec):
        return False
    level_set = not Foreign.TF_CPP_MIN_LOG_LEVEL.is_set(environ)
    if level_set:
        environ[Foreign.TF_CPP_MIN_LOG_LEVEL.name] = "1"
    if environ[Foreign.TF_CPP_MIN_LOG_LEVEL.name] != "0":
        _hold_import(meta_path)
    return level_set


def _hold_import(meta_path):
    if not any(isinstance(finder, NoticeFreeImport) for finder in meta_path):
        meta_path.insert(0, NoticeFreeImport("tensorflow", meta_path))


class NoticeFreeImport(importlib.abc.MetaPathFinder):
    """An import hook: the first import of `module` runs with its start-up notices left out
    of stderr (file descriptor 2, so C++ logging too); every other line is kept, in order."""

    def __init__(self, module, meta_path):
        self.module = module
        self._meta_path = meta_path  # the list it is in
        self._finding = False

    def find_spec(self, fullname, path=None, target=None):
        del path, target
        if fullname != self.module or self._finding:
            return None
        self._finding = True  # the real finders answer below
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self._finding = False
        if spec is not None and spec.loader is not None:
            # removed from the path when the module is loaded, not here: a look-up that
            # imports nothing (`importlib.util.find_spec`) must leave the hook in place
            spec.loader = _NoticeFreeLoader(spec.loader, self)
        return spec

    def loaded(self):
        if self in self._meta_path:
            self._meta_path.remove(self)  # once


class _NoticeFreeLoader(importlib.abc.Loader):
    """Runs the wrapped loader's `exec_module` with stderr held in a temporary file."""

    def __init__(self, loader, finder):
        self._loader = loader
        self._finder = finder

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._finder.loaded()
        module.__loader__ = self._loader  # the real loader once loaded
        if module.__spec__ is not None:
            module.__spec__.loader = self._loader
        with without_startup_notices():
            self._loader.exec_module(module)


@contextlib.contextmanager
def without_startup_notices():
    """Inside: what is written to file descriptor 2 is held; on exit it is written back to
    stderr without TensorFlow's start-up notices."""
    sys.stderr.flush()
    with tempfile.TemporaryFile() as held:
        stderr = os.dup(2)
        os.dup2(held.fileno(), 2)
        try:
            yield
        finally:
            try:
                sys.stderr.flush()
            finally:
                os.dup2(stderr, 2)
                os.close(stderr)
            held.seek(0)
            notices = NoticeDropper()
            kept = [line for line in held.read().decode("utf-8", "replace").splitlines(True)
                    if not notices.is_notice(line)]
            if kept:
                os.write(2, "".join(kept).encode("utf-8"))


def after_discovery(cluster, environ=None):
    """Once this process's cluster is known: library warnings shown by rank 0 only.

    Returns True when it installed the filter (ranks > 0 and servers of a
    job whose launcher does not filter output).
    """
    if verbose(environ) or cluster.launcher not in UNFILTERED_LAUNCHERS or cluster.is_chief:
        return False
    if cluster.world_size == 1 and not cluster.is_server:
        return False
    warnings.filterwarnings("ignore", module=LIBRARY_MODULES)
    return True
