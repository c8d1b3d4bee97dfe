"""The names profiling's producers and readers share: scopes, scalars, files, the profile request.

No TensorFlow here: the launcher (`tfdist-run`), the timeline reader
(`tfdist.profiling.timeline`) and the in-graph producers (the aggregation
layer, the strategies, `tfdist.profiling.counters`, `tfdist.profiling.report`)
build and parse every name from this module, so a name changes in one place.

* Communication scopes: every tfdist communication runs under the absolute
  name scope `tfdist/<algorithm>/<phase>/` (`communication_scope`; a
  bucket's phase is `<kind>_<index>`, `bucket_scope`; an algorithm's own
  ops lie in `algorithm_scope`), which the trace viewer shows and
  `phase_of` reads back from an op's node name. The
  counters' own ops run under `COUNTERS_SCOPE`, outside every such scope.
* TensorBoard scalars: `scalar_tag(name)` is `tfdist/<name>`, next to
  Keras' own scalars, with one text summary `CONFIGURATION_TAG`.
* Profiles: each rank profiles into `rank_run_dir(log_dir, rank)`, marks
  each training step with a `STEP_TRACE` event, and under Horovod adds
  `HOROVOD_TIMELINE_FILE`; the timeline writes `TIMELINE_FILE`,
  `OVERLAP_FILE` and `FIGURE_FILE` into the log directory.
* The profile request: `tfdist-run --profile DIR --profile-steps A:B` passes
  it to every rank in `PROFILE_DIR_ENV` and `PROFILE_STEPS_ENV`, and each
  rank reads it back (`tfdist.profiling.rank_profiler.profiler_from_environment`).
"""

import os
import re

from tfdist import env_vars

NAMESPACE = "tfdist"

# ------------------------------------------------------------------ scopes
COUNTERS_SCOPE = f"{NAMESPACE}_counters/"

# "<namespace>/<algorithm>/<phase>" anywhere in a node name (searched in the name + "/").
_PHASE = re.compile(rf"(?:^|/)({re.escape(NAMESPACE)}/[^/]+/[^/]+)/")


def algorithm_scope(algorithm):
    """The absolute name scope of an algorithm's ops: `tfdist/<algorithm>/`."""
    return f"{NAMESPACE}/{algorithm}/"


def communication_scope(algorithm, phase):
    """The absolute name scope of one communication phase: `tfdist/<algorithm>/<phase>/`."""
    return f"{algorithm_scope(algorithm)}{phase}/"


def bucket_scope(algorithm, kind, index):
    """The scope of an aggregator's bucket: `tfdist/<algorithm>/<kind>_<index>/`."""
    return communication_scope(algorithm, f"{kind}_{index}")


def phase_of(name):
    """The phase `tfdist/<algorithm>/<phase>` a node (or tensor) name lies in, or None."""
    found = _PHASE.search(f"{name}/")
    return found.group(1) if found else None


def is_counter_op(name):
    """True for the ops of tfdist's communication counters (not communication themselves)."""
    return COUNTERS_SCOPE in name


# ----------------------------------------------------------------- scalars
CONFIGURATION_TAG = f"{NAMESPACE}/configuration"


def scalar_tag(name):
    """The TensorBoard tag of a measurement (`comm_ms`, `ps/wait_ms`, ...): `tfdist/<name>`."""
    return f"{NAMESPACE}/{name}"


# ------------------------------------------------------------------ files
STEP_TRACE = "TraceContext"  # the profiler event that marks a training step (with step_num)
HOROVOD_TIMELINE_FILE = "horovod_timeline.json"
TIMELINE_FILE = f"{NAMESPACE}_timeline.json"
OVERLAP_FILE = f"{NAMESPACE}_overlap.json"
FIGURE_FILE = f"{NAMESPACE}_overlap.png"
_RANK_RUN = re.compile(r"rank_(\d+)")


def rank_run_dir(log_dir, rank):
    """The directory (a TensorBoard run) rank `rank` profiles into: `<log_dir>/rank_<rank>`."""
    return os.path.join(str(log_dir), f"rank_{rank}")


def rank_of_run(path):
    """The rank whose run `path` is (its last component is `rank_<k>`), or None."""
    found = _RANK_RUN.fullmatch(os.path.basename(os.path.normpath(str(path))))
    return int(found.group(1)) if found else None


# -------------------------------------------------------- profile request
PROFILE_DIR_ENV = env_vars.PROFILE_DIR.name
PROFILE_STEPS_ENV = env_vars.PROFILE_STEPS.name
DEFAULT_PROFILE_STEPS = "10:12"


def parse_profile_steps(text):
    """(first, last) training batches from "A:B" (1-based, inclusive) or "A" (one batch)."""
    parts = str(text).split(":")
    try:
        first, last = (int(parts[0]), int(parts[-1])) if len(parts) <= 2 else (None, None)
    except ValueError:
        first, last = None, None
    if first is None or not 1 <= first <= last:
        raise ValueError(f"profile steps must be 'A:B' with 1 <= A <= B (training batches, "
                         f"counted from 1 in each fit), or one batch 'A'. Got: {text!r}")
    return first, last
