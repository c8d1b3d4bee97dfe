"""Restarts: the exit code of a rank that backed up on a notice, and which restart this is.

A rank that backed up on a preemption notice exits with `PREEMPTED_EXIT_CODE`
(42, the code of tf-keras' `PreemptionCheckpointHandler`), so that a launcher
tells a planned stop from a crash: `tfdist-run --max-restarts` restarts the
group on it, as on a crash, and says which it was. The launcher numbers its
runs in `TFDIST_RESTART_COUNT` (0 for the first); a restarted rank that finds
no backup says so instead of silently starting from scratch.

TensorFlow-free: the launcher imports it.
"""

from tfdist import env_vars

PREEMPTED_EXIT_CODE = 42


def restart_count() -> int:
    """How many times the launcher has restarted this job (0: its first run, or not set)."""
    try:
        return env_vars.RESTART_COUNT.integer(default=0)
    except ValueError:
        return 0
