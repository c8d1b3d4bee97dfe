"""The chief's messages about the job: one logger, one line per message, not one per rank.

A multi-process job runs the same script P times, so a notice every rank
prints is printed P times (`tfdist-run` folds identical lines; other
launchers do not). What tfdist tells the user about the job as a whole - the
strategy, its aggregator and launcher, where parameter servers listen, a
setting it changed, how it partitioned a buffer - goes through `info` and
`warning` here: written by the chief (rank 0) only, to the current stderr,
one line each, through Python's `logging` logger `LOGGER_NAME` (a program
may raise its level, add handlers or silence it). Unlike absl's INFO, which
hides lines unless absl's flags were parsed, these show by default.

Failures are not chief messages: each rank reports its own, naming itself.
"""

import logging
import sys

LOGGER_NAME = "tfdist.chief"
_said_once = set()


class _CurrentStderr(logging.StreamHandler):
    """Writes to whatever `sys.stderr` is at the time (a test's capture, a redirect)."""

    def __init__(self):
        super().__init__(sys.stderr)

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value):
        del value


def logger():
    """The chief's `logging.Logger` (a handler of its own on stderr; not propagated)."""
    chief = logging.getLogger(LOGGER_NAME)
    if not chief.handlers:
        handler = _CurrentStderr()
        handler.setFormatter(logging.Formatter("%(message)s"))
        chief.addHandler(handler)
        chief.setLevel(logging.INFO)
        chief.propagate = False
    return chief


def _say(level, is_chief, message, args, once):
    if not is_chief:
        return
    if once:
        key = (message, args)
        if key in _said_once:
            return
        _said_once.add(key)
    logger().log(level, message, *args)


def info(is_chief, message, *args, once=False):
    """`message % args` on the chief (`is_chief`), once per process if `once`."""
    _say(logging.INFO, is_chief, message, args, once)


def warning(is_chief, message, *args, once=False):
    """`message % args` as a warning on the chief, once per process if `once`."""
    _say(logging.WARNING, is_chief, message, args, once)
