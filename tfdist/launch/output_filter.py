"""What `tfdist-run` leaves out of its processes' output: start-up noise and repeated warnings.

Every TensorFlow process prints the same start-up notices before any user code
runs (`tfdist.process_setup.startup_notices`); with N processes a user would see them N
times. A Python warning (Keras' `UserWarning`s) that every rank raises also
appears once per rank.

`OutputFilter` drops the known start-up lines and prints each distinct
Python warning once, whichever rank raises it first. Everything else passes
unchanged, in order. `tfdist-run --verbose` (or `TFDIST_VERBOSE=1`) turns the
filter off. Cost: one regular-expression match per output line.
"""

import re
import threading

from tfdist.process_setup.startup_notices import NoticeDropper

PYTHON_WARNING = re.compile(r"^\S.*:\d+: \w*Warning: ")
SOURCE_LINE_OF_WARNING = re.compile(r"^\s")


class OutputFilter:
    """Shared by the relays of all processes of a job (thread-safe); see the module doc."""

    def __init__(self, enabled=True):
        self.enabled = enabled
        self._seen_warnings = set()
        self._lock = threading.Lock()

    def stream(self):
        """A per-process filter: call it with each line (str); it returns the lines to print."""
        notices = NoticeDropper()
        source_line_follows = False  # the source line Python prints under a dropped warning

        def keep(line):
            nonlocal source_line_follows
            if not self.enabled:
                return [line]
            if source_line_follows:
                source_line_follows = False
                if SOURCE_LINE_OF_WARNING.search(line):
                    return []
            if notices.is_notice(line):
                return []
            if PYTHON_WARNING.match(line):
                with self._lock:
                    repeated = line in self._seen_warnings
                    self._seen_warnings.add(line)
                if repeated:
                    source_line_follows = True
                    return []
            return [line]

        return keep
