"""What `tfdist-run` leaves out of its processes' output: start-up noise and repeated warnings.

Every TensorFlow process prints the same start-up notices before any user code
runs (and before `TF_CPP_MIN_LOG_LEVEL` can act): absl's "All log messages
before absl::InitializeLog()" warning, the oneDNN and CPU-instruction
notices, CUDA plug-in registration messages on a machine without a GPU, and
in parameter-server processes an error-level "oneDNN supports DT_HALF only
on platforms with AVX-512" that reports nothing wrong. With N processes a
user sees all of it N times. A Python warning (Keras' `UserWarning`s) that
every rank raises also appears once per rank.

`OutputFilter` drops the known start-up lines and prints each distinct
Python warning once, whichever rank raises it first. Everything else passes
unchanged, in order. `tfdist-run --verbose` (or `TFDIST_VERBOSE=1`) turns the
filter off. Cost: one regular-expression match per output line.
"""

import re
import threading

# Start-up notices: (pattern of the line, pattern of a line that may follow it and goes too).
_LOG = r"^[IWE]\d{4} [\d:. ]+\d+ "
STARTUP_NOISE = (
    (re.compile(r"^WARNING: All log messages before absl::InitializeLog\(\) is called"), None),
    (re.compile(_LOG + r"port\.cc:\d+\] oneDNN custom operations are on"), None),
    (re.compile(_LOG + r"cpu_feature_guard\.cc:\d+\] This TensorFlow binary is optimized"),
     re.compile(r"^To enable the following instructions:")),
    (re.compile(r"oneDNN supports DT_HALF only on platforms with AVX-512"), None),
    (re.compile(_LOG + r"cuda_(?:dnn|fft|blas)\.cc:\d+\] Unable to register"), None),
    (re.compile(_LOG + r"cudart_stub\.cc:\d+\] Could not find cuda drivers"), None),
    (re.compile(_LOG + r"computation_placer\.cc:\d+\] computation placer already registered"),
     None),
)
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
        follower = None  # a pattern the next line is dropped for

        def keep(line):
            nonlocal follower
            if not self.enabled:
                return [line]
            if follower is not None:
                drop, follower = follower.search(line), None
                if drop:
                    return []
            for pattern, next_line in STARTUP_NOISE:
                if pattern.search(line):
                    follower = next_line
                    return []
            if PYTHON_WARNING.match(line):
                with self._lock:
                    repeated = line in self._seen_warnings
                    self._seen_warnings.add(line)
                if repeated:
                    follower = SOURCE_LINE_OF_WARNING  # Python prints the source line under it
                    return []
            return [line]

        return keep
