"""Whether the ranks of a tfdist-run job joined a tfdist strategy: a job that is not distributed says so.

A plain Keras script (no tfdist strategy) started by `tfdist-run -np 2`
trains two independent copies and exits 0; nothing in the ranks can tell,
because nothing of tfdist runs there. So the launcher asks: it gives every
process a directory of the job's own (`TFDIST_JOINED_DIR`), a rank that
creates a strategy with more than one worker leaves a file there
(`note_joined`); a minute into a job in which no rank has left one the
launcher says so (`EarlyNotice`), and at the end of a job in which none did
it prints `independent_processes_notice` (`tfdist.launch.cli`).
Cost: one empty file per rank, written once.
"""

import os
import time
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


class EarlyNotice:
    """Called while a job runs (`ProcessGroup.wait`'s `on_poll`): once `AFTER_SECONDS` have
    passed and no rank has joined a strategy, say at once that the processes may be running
    independently (the end of a long run is too late to learn it); `say(line)` prints."""

    AFTER_SECONDS = 60.0

    def __init__(self, directory: str, num_proc: int, say):
        self._directory = directory
        self._num_proc = num_proc
        self._say = say
        self._due = time.monotonic() + self.AFTER_SECONDS
        self._done = num_proc < 2

    def __call__(self) -> None:
        if self._done or time.monotonic() < self._due:
            return
        self._done = True
        if not any_joined(self._directory):
            self._say(f"{self.AFTER_SECONDS:g} s in, none of the {self._num_proc} processes "
                      "has created a tfdist strategy: unless the script creates one later, "
                      "they train independently (separate copies of one run, not one "
                      "distributed training). Create one, and build the model under its "
                      "scope: strategy = tfdist.strategies.RingAllReduceStrategy(); with "
                      "strategy.scope(): model = ...")


def independent_processes_notice(num_proc: int) -> str:
    """What tfdist-run prints after a job of `num_proc` processes in which no rank joined."""
    return (f"none of the {num_proc} processes created a tfdist strategy, so they "
            f"ran independently: {num_proc} separate runs of the script, not one distributed "
            "training. Create one and build the model under its scope:\n"
            "    strategy = tfdist.strategies.RingAllReduceStrategy()\n"
            "    with strategy.scope():\n"
            "        model = ...            # build and compile here\n"
            "    model.fit(...)")
