"""Quiet output under every launcher: what tfdist-run's filter does, done inside each process.

tfdist-run relays its processes' output through `tfdist.launch.output_filter`
(TensorFlow's start-up notices dropped, each distinct warning printed once for
the job). Under mpirun, srun, horovodrun, Ray Train or a Kubernetes Job the
launcher prints every rank's output as it comes, so each process keeps its own
quiet:

1. TensorFlow's start-up notices (absl's "All log messages before
   absl::InitializeLog()" line, the CPU-instruction and oneDNN notices) are
   info-level lines printed while TensorFlow is imported. When `tfdist` is
   imported before TensorFlow (`import tfdist` above `import keras`),
   `before_tensorflow` sets TF_CPP_MIN_LOG_LEVEL=1 (TensorFlow's info lines
   off, its warnings and errors kept) unless the user set it. Imported after,
   it is too late: export TF_CPP_MIN_LOG_LEVEL=1 in the job instead
   (`srun --export=ALL,TF_CPP_MIN_LOG_LEVEL=1`, `mpirun -x TF_CPP_MIN_LOG_LEVEL=1`).
2. Python warnings raised in library code (Keras, TensorFlow, NumPy, absl,
   tfdist) are the same on every rank, since every rank runs the same script:
   `after_discovery` has only rank 0 show them. Warnings attributed to the
   user's own modules show on every rank. What this gives up: a library
   warning that only another rank raises (its slice ran out of data) is not
   shown - tfdist-run's filter, which sees every rank's output, shows it.

Nothing changes under tfdist-run (its filter does this across ranks), for a
single process, or with TFDIST_VERBOSE=1. Cost: one environment check at
import and one warnings filter per process.
"""

import os
import sys
import warnings

ENV_VERBOSE = "TFDIST_VERBOSE"
LIBRARY_MODULES = r"(keras|tensorflow|tf_keras|numpy|absl|tfdist)(\.|$)"
# Launchers whose output tfdist does not relay (tfdist-run filters its own).
UNFILTERED_LAUNCHERS = ("horovodrun", "TF_CONFIG", "mpirun", "srun", "kubernetes")


def verbose(environ=None):
    environ = os.environ if environ is None else environ
    return environ.get(ENV_VERBOSE, "") not in ("", "0")


def _unfiltered_job(environ):
    from tfdist import cluster as cluster_lib  # pylint: disable=import-outside-toplevel

    try:
        spec = cluster_lib.discover(environ)
    except ValueError:  # reported when a strategy discovers the cluster
        return False
    return spec.launcher in UNFILTERED_LAUNCHERS and (spec.world_size > 1 or spec.is_server)


def before_tensorflow(environ=None, modules=None):
    """At `import tfdist`: TensorFlow's info lines off in a multi-process job, if still possible.

    Returns True when it set TF_CPP_MIN_LOG_LEVEL.
    """
    environ = os.environ if environ is None else environ
    modules = sys.modules if modules is None else modules
    if ("tensorflow" in modules or "TF_CPP_MIN_LOG_LEVEL" in environ or verbose(environ)
            or not _unfiltered_job(environ)):
        return False
    environ["TF_CPP_MIN_LOG_LEVEL"] = "1"
    return True


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
