"""A merged timeline of every rank's communication, and how much of it computation hides.

Usage:
    python -m tfdist.profiling.timeline LOG_DIR [--steps A:B]

(`tfdist-run --profile LOG_DIR` runs it when the job ends.) It plays the
Horovod timeline's role, from TensorFlow's own profiles: it reads the newest
profile of every rank, `LOG_DIR/rank_<k>/plugins/profile/<run>/*.xplane.pb`
(written by `keras.callbacks.TensorBoard(profile_batch=...)` or
`tfdist-run --profile`), and writes into LOG_DIR:

* `tfdist_timeline.json`, in Chrome's trace event format (open it in
  https://ui.perfetto.dev or chrome://tracing): one process per rank, with a
  row of training steps, a row of computation (the intervals when any
  TensorFlow op other than communication ran) and one row per communication
  phase `tfdist/<algorithm>/<kind>_<index>` (its ops' spans merged);
* `tfdist_overlap.json`: per rank and step, the step time, computation,
  communication, the communication hidden behind computation (both running)
  and the exposed rest; totals, and time per phase;
* `tfdist_overlap.png` (with matplotlib): those numbers as bars per rank.

Classification: an op event (`<node name>:<op type>`) whose node name has a
`tfdist/<algorithm>/<phase>` scope is communication (every tfdist
communication runs under one; `tfdist.profiling.names` builds and parses
them); tfdist's own counters (`tfdist_counters/`) are reported apart; every
other op event is computation. The TensorFlow profiler does not see
Horovod's ops: under the Horovod engine the profile comes with Horovod's own
timeline (rank 0's `horovod_timeline.json`: every tensor's negotiation and
execution, and each rank's arrival when Horovod's response cache is off),
which is merged in: rank 0's communication is its spans; the other ranks' is
not recorded. Timestamps are each host's clock: ranks on one machine align
exactly, ranks on several machines up to their clocks' offset.
"""

import argparse
import collections
import glob
import json
import os
import re
import sys

from tfdist.profiling import names
from tfdist.profiling.names import (FIGURE_FILE, HOROVOD_TIMELINE_FILE, OVERLAP_FILE,
                                    TIMELINE_FILE)

# "<node name>:<op type>"; not the collective runtime's "ReceiveValue:0" (inside its op's span)
_OP_EVENT = re.compile(r"^(?P<node>[^:\s]+):(?P<type>[A-Za-z_][A-Za-z0-9_]*)$")


def newest_profiles(log_dir):
    """{rank: path of its newest .xplane.pb} under `log_dir`/rank_<k>."""
    found = {}
    for rank_dir in glob.glob(names.rank_run_dir(log_dir, "*")):
        rank = names.rank_of_run(rank_dir)
        runs = sorted(glob.glob(os.path.join(rank_dir, "plugins", "profile", "*", "*.xplane.pb")))
        if rank is not None and runs:
            found[rank] = runs[-1]
    return dict(sorted(found.items()))


def read_events(path):
    """(steps, computation, communication, instrumentation) of one profile.

    Lists of (start_ns, end_ns, ...): steps: (start, end, step number);
    computation: (start, end); communication: (start, end, phase, op type);
    instrumentation: (start, end) of tfdist's communication counters' own ops.
    """
    from tfdist import _tf  # TensorFlow's profile format; imported only when reading

    space = _tf.XSpace()
    with open(path, "rb") as file:
        space.ParseFromString(file.read())
    steps, computation, communication, instrumentation = [], [], [], []
    # Event times are relative to the session's start; make them wall-clock nanoseconds.
    origin = next((stat.int64_value or stat.uint64_value for plane in space.planes
                   for stat in plane.stats
                   if plane.stat_metadata[stat.metadata_id].name == "profile_start_time"), 0)
    for plane in space.planes:
        step_stat = next((k for k, m in plane.stat_metadata.items() if m.name == "step_num"), None)
        for line in plane.lines:
            for event in line.events:
                name = plane.event_metadata[event.metadata_id].name
                start = origin + line.timestamp_ns + event.offset_ps // 1000
                end = start + max(event.duration_ps // 1000, 1)
                if name == names.STEP_TRACE:
                    number = next((s.int64_value or s.uint64_value for s in event.stats
                                   if s.metadata_id == step_stat), None)
                    if number is not None:
                        steps.append((start, end, int(number)))
                    continue
                op = _OP_EVENT.match(name)
                if op is None:
                    continue
                phase = names.phase_of(op.group("node"))
                if names.is_counter_op(op.group("node")):
                    instrumentation.append((start, end))
                elif phase:
                    communication.append((start, end, phase, op.group("type")))
                else:
                    computation.append((start, end))
    return sorted(steps), sorted(computation), sorted(communication), sorted(instrumentation)


def read_horovod_timeline(path):
    """(spans, arrivals) of Horovod's timeline, in absolute nanoseconds.

    Horovod writes every tensor as a process with nested begin/end events -
    NEGOTIATE_<OP> (until every rank submitted the tensor), then the
    operation (ALLREDUCE, ...) with its activities - and one zero-length
    event per rank as it submits; times are microseconds since
    `start_time_since_epoch_in_micros`. spans: (start, end, phase, name,
    depth); arrivals: (time, phase, rank). phase: the tensor's
    `tfdist/<algorithm>/<kind>_<index>` scope.
    """
    with open(path, encoding="utf-8") as file:
        text = file.read().strip()
    if not text.endswith("]"):  # still being written
        text = text.rstrip(",") + "]"
    events = json.loads(text)
    metadata = [e for e in events if e.get("ph") == "M"]
    start_us = next((e["args"]["start_time_since_epoch_in_micros"] for e in metadata
                     if "start_time_since_epoch_in_micros" in e.get("args", {})), 0)
    tensors = {e["pid"]: e["args"]["name"] for e in metadata
               if e.get("name") == "process_name" and "name" in e.get("args", {})}

    def phase_of(pid):
        tensor = tensors.get(pid, "")
        return names.phase_of(tensor) or f"horovod/{tensor}"

    stacks, spans, arrivals = collections.defaultdict(list), set(), []
    for event in events:
        kind, pid = event.get("ph"), event.get("pid")
        at = (start_us + event.get("ts", 0)) * 1000
        if kind == "B":
            stacks[pid].append((at, event.get("name", "")))
        elif kind == "E" and stacks[pid]:
            begin, name = stacks[pid].pop()
            spans.add((begin, at, phase_of(pid), name, len(stacks[pid])))
        elif kind == "X" and str(event.get("name", "")).isdigit():
            arrivals.append((at, phase_of(pid), int(event["name"])))
    return sorted(spans), sorted(set(arrivals))


def union(intervals):
    """Sorted disjoint intervals covering `intervals` ((start, end, ...) tuples)."""
    merged = []
    for start, end, *_ in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [tuple(i) for i in merged]


def length(intervals):
    return sum(end - start for start, end in intervals)


def intersect(a, b):
    """Intersection of two sorted disjoint interval lists."""
    result, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        start, end = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if start < end:
            result.append((start, end))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return result


def clip(intervals, start, end):
    return [(max(s, start), min(e, end)) for s, e in intervals if e > start and s < end]


def step_breakdown(step, computation, communication, instrumentation=()):
    """Milliseconds of a step: computation, communication, hidden and exposed communication,
    and tfdist's counters (`instrumentation_ms`: the union of their ops' spans)."""
    start, end, number = step
    compute = clip(computation, start, end)
    comm = clip(communication, start, end)
    hidden = length(intersect(compute, comm))
    return {"step": number, "step_ms": (end - start) / 1e6, "compute_ms": length(compute) / 1e6,
            "comm_ms": length(comm) / 1e6, "hidden_ms": hidden / 1e6,
            "exposed_ms": (length(comm) - hidden) / 1e6,
            "instrumentation_ms": length(clip(instrumentation, start, end)) / 1e6}


def analyse(log_dir, steps=None):
    """(Chrome trace dict, overlap dict) for the profiles under `log_dir` (module docstring)."""
    profiles = newest_profiles(log_dir)
    if not profiles:
        raise FileNotFoundError(
            f"no profiles under {log_dir!r}: expected rank_<k>/plugins/profile/<run>/*.xplane.pb "
            "(from TensorBoard(profile_batch=...) or tfdist-run --profile)")
    per_rank = {rank: read_events(path) for rank, path in profiles.items()}
    horovod = {}
    for rank, path in profiles.items():
        engine_timeline = os.path.join(names.rank_run_dir(log_dir, rank), HOROVOD_TIMELINE_FILE)
        if os.path.exists(engine_timeline):
            horovod[rank] = read_horovod_timeline(engine_timeline)
            spans = horovod[rank][0]
            per_rank[rank][2].extend((start, end, phase, name)
                                     for start, end, phase, name, depth in spans if depth == 0)
    origin = min((e[0] for events in per_rank.values() for kind in events for e in kind),
                 default=0)
    trace, overlap = [], {"log_dir": log_dir, "ranks": {}}
    for rank, (rank_steps, computation, communication, instrumentation) in per_rank.items():
        if steps is not None:
            rank_steps = [s for s in rank_steps if steps[0] <= s[2] <= steps[1]]
        window = ((rank_steps[0][0], rank_steps[-1][1]) if rank_steps else
                  (origin, max((e[1] for e in computation + communication), default=origin)))
        compute_busy = union(clip(union(computation), *window))
        comm_busy = union(clip(union(communication), *window))
        phases = collections.defaultdict(list)
        for start, end, phase, _ in communication:
            if end > window[0] and start < window[1]:
                phases[phase].append((start, end))
        counted = union(clip(union(instrumentation), *window))
        breakdown = [step_breakdown(s, compute_busy, comm_busy, counted) for s in rank_steps]
        hidden = length(intersect(compute_busy, comm_busy))
        overlap["ranks"][str(rank)] = {
            "profile": profiles[rank], "steps": breakdown,
            "total": {"compute_ms": length(compute_busy) / 1e6,
                      "comm_ms": length(comm_busy) / 1e6, "hidden_ms": hidden / 1e6,
                      "exposed_ms": (length(comm_busy) - hidden) / 1e6,
                      "hidden_share": hidden / length(comm_busy) if comm_busy else 0.0,
                      "instrumentation_ms": length(counted) / 1e6},
            "phases_ms": {p: length(union(v)) / 1e6 for p, v in sorted(phases.items())},
            "communication_source": ("Horovod's timeline" if rank in horovod else
                                     "none: Horovod writes its timeline on rank 0 only"
                                     if horovod else "TensorFlow profile")}
        trace += _rank_trace(rank, origin, rank_steps, compute_busy, phases,
                             horovod.get(rank))
    shares = [r["total"]["hidden_share"] for r in overlap["ranks"].values()]
    overlap["hidden_share"] = sum(shares) / len(shares)
    return {"traceEvents": trace, "displayTimeUnit": "ms"}, overlap


def _rank_trace(rank, origin, steps, compute_busy, phases, horovod=None):
    def span(name, tid, start, end, **args):
        return {"name": name, "ph": "X", "pid": rank, "tid": tid,
                "ts": (start - origin) / 1e3, "dur": (end - start) / 1e3, "args": args}

    rows = ["steps", "computation"] + sorted(phases)
    if horovod is not None:  # Horovod's own spans, nested, and each rank's arrival
        spans, arrivals = horovod
        rows.append("Horovod timeline")
        tid = len(rows) - 1
        extra = [span(f"{phase}: {name}", tid, start, end)
                 for start, end, phase, name, _ in spans]
        extra += [{"name": f"rank {arrived} ready", "ph": "i", "s": "t", "pid": rank, "tid": tid,
                   "ts": (at - origin) / 1e3, "args": {"phase": phase}}
                  for at, phase, arrived in arrivals]
    else:
        extra = []
    events = [{"name": "process_name", "ph": "M", "pid": rank, "args": {"name": f"rank {rank}"}},
              {"name": "process_sort_index", "ph": "M", "pid": rank, "args": {"sort_index": rank}}]
    events += [{"name": "thread_name", "ph": "M", "pid": rank, "tid": tid, "args": {"name": row}}
               for tid, row in enumerate(rows)]
    events += [span(f"step {number}", 0, start, end) for start, end, number in steps]
    events += [span("computation", 1, start, end) for start, end in compute_busy]
    for tid, phase in enumerate(sorted(phases), start=2):
        events += [span(phase, tid, start, end) for start, end in union(phases[phase])]
    return events + extra


def plot(overlap, path):
    """Stacked bars per rank: computation alone, communication hidden, communication exposed."""
    import matplotlib  # pylint: disable=import-outside-toplevel

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel

    ranks = sorted(overlap["ranks"], key=int)
    totals = [overlap["ranks"][r]["total"] for r in ranks]
    count = [max(len(overlap["ranks"][r]["steps"]), 1) for r in ranks]
    compute_only = [(t["compute_ms"] - t["hidden_ms"]) / n for t, n in zip(totals, count)]
    hidden = [t["hidden_ms"] / n for t, n in zip(totals, count)]
    exposed = [t["exposed_ms"] / n for t, n in zip(totals, count)]
    figure, axes = plt.subplots(figsize=(6.4, 3.6))
    labels = [f"rank {r}" for r in ranks]
    axes.barh(labels, compute_only, color="#4c72b0", label="computation only")
    axes.barh(labels, hidden, left=compute_only, color="#55a868",
              label="communication hidden behind computation")
    axes.barh(labels, exposed, left=[a + b for a, b in zip(compute_only, hidden)],
              color="#c44e52", label="communication exposed")
    axes.set_xlabel("milliseconds per profiled step")
    axes.set_title(f"Overlap: {100 * overlap['hidden_share']:.0f}% of communication hidden")
    axes.legend(loc="lower center", bbox_to_anchor=(0.5, 1.12), ncol=2, fontsize=8,
                frameon=False)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def write(log_dir, steps=None):
    """Analyse `log_dir`; write the timeline, the overlap numbers and (matplotlib) the figure."""
    trace, overlap = analyse(log_dir, steps)
    with open(os.path.join(log_dir, TIMELINE_FILE), "w", encoding="utf-8") as file:
        json.dump(trace, file)
    with open(os.path.join(log_dir, OVERLAP_FILE), "w", encoding="utf-8") as file:
        json.dump(overlap, file, indent=1)
    try:
        plot(overlap, os.path.join(log_dir, FIGURE_FILE))
    except ImportError:
        pass  # matplotlib is optional
    return overlap


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("log_dir", help="directory with rank_<k>/plugins/profile/... runs")
    parser.add_argument("--steps", default=None,
                        help="training steps to keep, 'A:B' (default: every profiled step)")
    args = parser.parse_args(argv)
    try:
        steps = names.parse_profile_steps(args.steps) if args.steps else None
    except ValueError as error:
        parser.error(f"--steps: {error}")
    try:
        overlap = write(args.log_dir, steps)
    except FileNotFoundError as error:
        print(f"tfdist timeline: {error}", file=sys.stderr)
        return 1
    for rank, numbers in overlap["ranks"].items():
        total = numbers["total"]
        print(f"tfdist timeline: rank {rank}: {len(numbers['steps'])} steps, computation "
              f"{total['compute_ms']:.1f} ms, communication {total['comm_ms']:.1f} ms "
              f"({100 * total['hidden_share']:.0f}% hidden)")
    print(f"tfdist timeline: {os.path.join(args.log_dir, TIMELINE_FILE)} (open in "
          "https://ui.perfetto.dev), overlap in "
          f"{os.path.join(args.log_dir, OVERLAP_FILE)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
