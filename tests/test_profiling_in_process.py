"""Counting changes no training: the counted step on the hard path, at 3 simulated ranks.

The worker script's keras.io-style text classifier (tests/scripts/profiled_training.py)
with 386 rows in global batches of 32 (the last training batch leaves one
rank's slice empty), a keras.io-style `train_step` and Adam's clipnorm,
under an unchanged `keras.callbacks.TensorBoard` and `CommunicationMonitor`:
three ranks as threads of this process (`tfdist.simulation`) train as one
does, and the chief's TensorBoard run has every tfdist/ scalar.
test_profiling.py has the profiles and the engines' timelines, which need processes.
"""

import json
import os
import sys

import numpy as np
import pytest

from test_profiling import COMMON_TAGS, check_equivalent, scalars

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "scripts"))
import profiled_training  # noqa: E402  pylint: disable=wrong-import-position

from tfdist.profiling import names, timeline  # noqa: E402  pylint: disable=wrong-import-position
from tfdist.profiling.counters import CounterSnapshot, measurements  # noqa: E402  pylint: disable=wrong-import-position
from tfdist.profiling.names import parse_profile_steps  # noqa: E402  pylint: disable=wrong-import-position
from tfdist.simulation import simulate_processes  # noqa: E402  pylint: disable=wrong-import-position

OPTIONS = ["--rows", "386", "--custom-step", "--clipnorm", "0.05", "--profile-batch", "0"]


def train(directory, world):
    out, log_dir = str(directory / "out"), str(directory / "logs")
    simulate_processes(world, lambda rank: profiled_training.main(
        [out, log_dir, "--strategy", "ring", *OPTIONS]))
    ranks = []
    for rank in range(world):
        with open(f"{out}.rank{rank}.json") as f:
            ranks.append(json.load(f))
    return ranks, log_dir


def test_counting_changes_no_training_with_3_ranks_empty_slices_custom_step_and_clipping(
        tmp_path):
    single = train(tmp_path / "one", 1)[0][0]
    ranks, log_dir = train(tmp_path / "three", 3)
    check_equivalent(ranks, single)
    written = scalars(os.path.join(log_dir, "train"))
    assert {f"tfdist/{t}" for t in COMMON_TAGS} <= set(written), sorted(written)
    assert all(value in (0, 1, 2) for _, value in written["tfdist/slowest_rank"])
    assert all(value > 0 for _, value in written["tfdist/comm_ms"])
    assert np.isfinite(ranks[0]["history"]["loss"]).all()


# ------------------------------------------------- units (no processes)
def test_timeline_interval_arithmetic():
    busy = timeline.union([(5, 7, "a"), (0, 2), (1, 3), (6, 9)])
    assert busy == [(0, 3), (5, 9)]
    assert timeline.length(busy) == 7
    assert timeline.intersect(busy, [(2, 6)]) == [(2, 3), (5, 6)]
    assert timeline.clip(busy, 1, 6) == [(1, 3), (5, 6)]
    step = timeline.step_breakdown((0, 10, 7), [(0, 4)], [(3, 6)])
    assert step == {"step": 7, "step_ms": 1e-5, "compute_ms": 4e-6, "comm_ms": 3e-6,
                    "hidden_ms": 1e-6, "exposed_ms": 2e-6, "instrumentation_ms": 0.0}


def test_measurements_between_snapshots():
    def snapshot(steps, seconds, sent, wait, slowest, compared):
        return CounterSnapshot(steps=steps, calls=3 * steps, seconds=seconds,
                               payload_bytes=1e6 * steps, sent_bytes=sent, compared_steps=compared,
                               wait_seconds=wait, slowest_counts=slowest, server_bytes=(),
                               host_seconds=0.0)

    numbers = measurements(snapshot(10, 1.0, 1e6, 0.1, (4, 5), 9),
                           snapshot(20, 2.0, 3e6, 0.2, (5, 14), 19), world_size=2,
                           wall_seconds=4.0)
    assert numbers["comm_ms"] == pytest.approx(100.0)
    assert numbers["step_ms"] == pytest.approx(400.0)
    assert numbers["comm_share"] == pytest.approx(0.25)
    assert numbers["sent_mb"] == pytest.approx(0.2)
    assert numbers["algbw_gbps"] == pytest.approx(0.01)  # 10 MB in 1 s
    assert numbers["busbw_gbps"] == pytest.approx(0.01)  # x 2 (P - 1) / P = 1 for P = 2
    assert numbers["wait_ms"] == pytest.approx(10.0)
    assert numbers["slowest_rank"] == 1
    same = snapshot(5, 1, 1, 0, (0, 0), 0)
    assert measurements(same, same, 2, 1) == {}


def test_profile_steps_are_validated():
    assert parse_profile_steps("3:5") == (3, 5)
    assert parse_profile_steps("4") == (4, 4)
    for bad in ("0:3", "5:2", "a:b", "1:2:3", ""):
        with pytest.raises(ValueError, match="Got"):
            parse_profile_steps(bad)


def test_the_names_producers_build_are_the_names_the_timeline_reads():
    bucket = names.bucket_scope("ring", "gradients", 1)
    assert bucket == "tfdist/ring/gradients_1/"  # what the trace viewer and users see
    assert names.phase_of(f"replica/{bucket}CollectiveReduceV2") == "tfdist/ring/gradients_1"
    assert names.phase_of(names.communication_scope("ps_async", "push") + "Send") == (
        "tfdist/ps_async/push")
    counter_op = names.COUNTERS_SCOPE + "Timestamp"
    assert names.is_counter_op(counter_op) and names.phase_of(counter_op) is None
    assert names.phase_of("sequential/dense/MatMul") is None
    assert names.rank_of_run(names.rank_run_dir("logs", 3)) == 3
    assert names.rank_of_run("logs/train") is None
    assert names.scalar_tag("ps/wait_ms") == "tfdist/ps/wait_ms"
