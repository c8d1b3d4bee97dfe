"""The MPI engine's compiled TensorFlow ops (`mpi_collectives.cc`): built once, then loaded.

`ops()` returns the loaded op module (`tfdist_mpi_allreduce`, `tfdist_mpi_reduce_scatter`,
`tfdist_mpi_allgather`, `tfdist_mpi_broadcast`); `unavailable_reason()` says why it cannot
be had here (no compiler or no Open MPI headers, or the build's error), or None.

Built with g++ from TensorFlow's compile and link flags (`tf.sysconfig`) and Open MPI's
(`mpicxx --showme:compile` / `:link`), as Horovod is built against both: about 5-10 s, once
per TensorFlow version, MPI library and source. The library goes to
`TFDIST_OP_CACHE` (default ~/.cache/tfdist/ops) under a name made of those three, so a
new TensorFlow builds anew and every process of a job (and every job) loads the same file.
Ranks starting together build it once: the first takes a file lock, the others wait for it
and load its result. `make install` builds it (`python -m tfdist.comm.mpi_kernels`).
"""

import contextlib
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from typing import Any, List, Optional

from tfdist import env_vars

SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "mpi_collectives.cc")
BUILD_TIMEOUT_SECONDS = 300

_lock = threading.Lock()
_loaded: List[Any] = []
_failure: List[str] = []


def _mpi_flags() -> List[List[str]]:
    """[compile flags, link flags] of the MPI library mpicxx wraps."""
    if shutil.which("mpicxx") is None:
        raise RuntimeError("no `mpicxx` on PATH (Open MPI's compiler wrapper: apt-get install "
                           "libopenmpi-dev, or `make install` in a clone of tfdist)")
    return [subprocess.run(["mpicxx", f"--showme:{part}"], capture_output=True, text=True,
                           check=True, timeout=60).stdout.split()
            for part in ("compile", "link")]


def library_path() -> str:
    """Where the library for this TensorFlow, MPI and source lives (built or not)."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    with open(SOURCE, "rb") as source:
        key = hashlib.sha256(source.read())
    key.update(tf.__version__.encode())
    key.update(repr(_mpi_flags()).encode())
    key.update(sys.version.encode())
    cache = os.path.expanduser(env_vars.OP_CACHE.get(default="~/.cache/tfdist/ops"))
    return os.path.join(cache, f"mpi_collectives-tf{tf.__version__}-{key.hexdigest()[:16]}.so")


def build(path: str) -> None:
    """Compile `SOURCE` into `path` (atomically: a temporary file renamed)."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    if shutil.which("g++") is None:
        raise RuntimeError("no `g++` on PATH to build the MPI engine's TensorFlow ops")
    mpi_compile, mpi_link = _mpi_flags()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    handle, partial = tempfile.mkstemp(suffix=".so.partial", dir=os.path.dirname(path))
    os.close(handle)
    command = ["g++", "-std=c++17", "-shared", "-fPIC", "-O2", "-Wno-deprecated-declarations",
               SOURCE, "-o", partial,
               *tf.sysconfig.get_compile_flags(), *mpi_compile,
               *tf.sysconfig.get_link_flags(), *mpi_link]
    try:
        done = subprocess.run(command, capture_output=True, text=True,
                              timeout=BUILD_TIMEOUT_SECONDS, check=False)
        if done.returncode != 0:
            raise RuntimeError("building the MPI engine's TensorFlow ops failed:\n  "
                               + " ".join(command) + "\n" + done.stderr[-3000:])
        os.replace(partial, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.remove(partial)


def ops():
    """The loaded op module (built first if needed), or a RuntimeError saying why not."""
    with _lock:
        if _loaded:
            return _loaded[0]
        if _failure:
            raise RuntimeError(_failure[0])
        try:
            _loaded.append(_load())
        except (RuntimeError, OSError, subprocess.SubprocessError) as error:
            _failure.append(f"tfdist: the MPI engine is unavailable: {error}")
            raise RuntimeError(_failure[0]) from error
        return _loaded[0]


def _load():
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    path = library_path()
    if not os.path.exists(path):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path + ".lock", "w", encoding="utf-8") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # another rank may be building it now
            if not os.path.exists(path):
                build(path)
    try:
        return tf.load_op_library(path)
    except tf.errors.NotFoundError as error:
        raise RuntimeError(f"loading {path} failed: {error}") from error


def unavailable_reason() -> Optional[str]:
    """None when `ops()` loads, else why it cannot (built on first call)."""
    try:
        ops()
    except RuntimeError as error:
        return str(error)
    return None


def main() -> int:
    """`python -m tfdist.comm.mpi_kernels`: build (or find) the library, print its path."""
    reason = unavailable_reason()
    if reason:
        print(reason, file=sys.stderr)
        return 1
    print(library_path())
    return 0
