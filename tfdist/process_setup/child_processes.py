"""Child processes that do not outlive their parent (the launcher, or a worker).

Used by `tfdist-run` for the job's processes and by a parameter-server
worker for its co-located server process.
"""

import ctypes
import os
import signal

_PR_SET_PDEATHSIG = 1


def die_with_parent():
    """preexec_fn: new session + SIGTERM when the parent exits (Linux).

    The new session lets the parent signal the child's whole process tree.
    """
    os.setsid()
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except OSError:  # not Linux: the parent's own signal handling still applies
        pass
