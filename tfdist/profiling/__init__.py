"""Profiling: what a job's communication costs, from the training step to the merged timeline.

One job per module, imported on first use (this package imports nothing, so
`names` stays free of TensorFlow for the launcher):

* `names`: the scope, scalar, file and environment names that producers and
  readers share, and the profile request's parser (no TensorFlow);
* `counters`: in-graph counters of one process's communication
  (`CommunicationCounters`, used by the aggregation layer and strategies);
* `report`: `CommunicationReport` (numbers per step over an interval) and
  `TensorBoardScalars` (those numbers as `tfdist/...` scalars);
* `rank_profiler`: `RankProfiler`, TensorFlow's profiler on every rank, and
  the profiler `tfdist-run --profile` asks for;
* `timeline`: the reader, `python -m tfdist.profiling.timeline LOG_DIR`,
  which merges the ranks' profiles into one timeline and an overlap report.
"""

import importlib

_SUBMODULES = ("counters", "names", "rank_profiler", "report", "timeline")


def __getattr__(name):
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + list(_SUBMODULES))
