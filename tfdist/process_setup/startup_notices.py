"""TensorFlow's start-up notices: the lines every TensorFlow process prints before user code runs.

Importing TensorFlow prints, on stderr and before `TF_CPP_MIN_LOG_LEVEL` can
act on all of them: absl's "All log messages before absl::InitializeLog()"
warning, the oneDNN notice ("oneDNN custom operations are on", info level,
printed once by each of TensorFlow's two shared libraries, each with absl's
warning, on CPUs where TensorFlow turns oneDNN on: AVX-512 VNNI or BF16, or
TF_ENABLE_ONEDNN_OPTS=1), the CPU-instruction notice (`cpu_feature_guard`),
CUDA plug-in registration messages on a machine without a GPU, gRPC's
"Started server with target" when a rank starts TensorFlow's collective
server (its own port, nothing the user can act on), and in
parameter-server processes an error-level "oneDNN supports DT_HALF only on
platforms with AVX-512" that reports nothing wrong. None says anything about
the user's job. `NoticeDropper` recognizes them, line by line; tfdist-run's
output filter (`tfdist.launch.output_filter`) and the in-process filter of
other launchers (`tfdist.process_setup.quiet_output`) both use it.
"""

import re

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
    (re.compile(_LOG + r"grpc_server_lib\.cc:\d+\] Started server with target: grpc://"), None),
)


class NoticeDropper:
    """One output stream's recognizer: `is_notice(line)` is True for a start-up notice line
    (or the line a notice continues on). Stateful: feed it every line of the stream in order."""

    def __init__(self):
        self._follower = None  # a pattern the next line is dropped for

    def is_notice(self, line):
        follower, self._follower = self._follower, None
        if follower is not None and follower.search(line):
            return True
        for pattern, next_line in STARTUP_NOISE:
            if pattern.search(line):
                self._follower = next_line
                return True
        return False
