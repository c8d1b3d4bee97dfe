"""Whether the ranks of a tfdist-run job joined a tfdist strategy: a job that is not distributed says so.

A plain Keras script (no tfdist strategy) started by `tfdist-run -np 2`
trains two independent copies and exits 0; nothing in the ranks can tell,
because nothing of tfdist runs there. So the launcher asks: it gives every
process a directory of the job's own (`TFDIST_JOINED_DIR`), a rank that
creates a strategy with more than one worker leaves a file there
(`note_joined`), and at the end of a job in which no rank left one the
launcher prints `independent_processes_notice` (`tfdist.launch.cli`).
Cost: one empty file per rank, written once.
"""

import os
from typing import Optional

from tfdist import env_vars


def note_joined(rank: int, environ: Optional[dict] = None) -> None:
    """This rank created a multi-process tfdist strategy (no-op outside tfdist-run)."""
    directory = env_vars.JOINED_DIR.get(environ)
    if not directory:
        return
    try:
        with open(os.path.join(directory, f"rank-{int(rank)}"), "w", encoding="utf-8"):
            pass
    except OSError:  # the launcher's directory is gone: the job is ending anyway
        pass


def any_joined(directory: str) -> bool:
    """True if some rank of the job noted that it joined a strategy."""
    try:
        return any(name.startswith("rank-") for name in os.listdir(directory))
    except OSError:
        return False


def independent_processes_notice(num_proc: int) -> str:
    """What tfdist-run prints after a job of `num_proc` processes in which no rank joined."""
    return (f"tfdist-run: none of the {num_proc} processes created a tfdist strategy, so they "
            f"ran independently: {num_proc} separate runs of the script, not one distributed "
            "training. Create one and build the model under its scope:\n"
            "    strategy = tfdist.strategies.RingAllReduceStrategy()\n"
            "    with strategy.scope():\n"
            "        model = ...            # build and compile here\n"
            "    model.fit(...)")
