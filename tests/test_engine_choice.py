"""`backend="auto"`: the fastest engine the job can run, from the measured engine curves."""

import json
import os

import pytest

from tfdist.process_setup import engine_choice
from tfdist.process_setup.engine_choice import COLLECTIVE, HOROVOD_GLOO, HOROVOD_MPI, MPI

RESULTS = os.path.join(os.path.dirname(__file__), os.pardir, "benchmarks", "results")
MiB = 2**20


def test_the_table_is_the_committed_benchmark_result():
    """Re-running `tfdist-bench --only engines` and committing a different order must
    change the choice: the table and the result file may not drift apart."""
    with open(os.path.join(RESULTS, "engine_curves.json")) as f:
        summary = json.load(f)["summary"]
    for engine, key in ((MPI, "mpi_engine"), (HOROVOD_MPI, "mpi"), (HOROVOD_GLOO, "gloo")):
        assert engine_choice.MEASURED_OVER_TF_RING[engine] == {
            int(size): ratio for size, ratio in summary["over_tf_ring"][key].items()}


@pytest.mark.parametrize("nbytes, measured_at", [
    (1, 4096),                       # below the smallest size measured: the smallest
    (4 * MiB, 4 * MiB),              # the default bucket
    (5 * MiB, 4 * MiB),              # between sizes: the largest measured below
    (32 * MiB, 16 * MiB),
    (1 << 30, 64 * MiB),             # above the largest: the largest
])
def test_relative_time_reads_the_curve_at_or_below_the_bucket(nbytes, measured_at):
    for engine in (MPI, HOROVOD_MPI, HOROVOD_GLOO):
        assert engine_choice.relative_time(engine, nbytes) == (
            engine_choice.MEASURED_OVER_TF_RING[engine][measured_at])
    assert engine_choice.relative_time(COLLECTIVE, nbytes) == 1.0


@pytest.mark.parametrize("launched, transport, mpi_job, expected", [
    (False, "", False, COLLECTIVE),       # srun, TF_CONFIG, Ray, Kubernetes, tfdist-run --no-mpi
    (True, "gloo", False, HOROVOD_GLOO),  # horovodrun, tfdist-run --no-mpi --horovod
    (True, "gloo", True, MPI),            # plain tfdist-run (mpirun and Horovod installed)
    (True, "mpi", False, HOROVOD_MPI),    # mpirun, the MPI engine's ops not built
    (True, "mpi", True, MPI),             # mpirun, horovodrun --mpi
])
def test_the_fastest_available_engine_is_chosen_and_the_faster_ones_named(
        launched, transport, mpi_job, expected):
    ours, mpi, gloo = (f"{engine_choice.relative_time(e, 4 * MiB):.2f}x"
                       for e in (MPI, HOROVOD_MPI, HOROVOD_GLOO))
    assert engine_choice.relative_time(MPI, 4 * MiB) < engine_choice.relative_time(
        HOROVOD_MPI, 4 * MiB) < engine_choice.relative_time(
        HOROVOD_GLOO, 4 * MiB) < 1  # as measured; the cases below rely on that order
    available = engine_choice.available_engines(launched, transport, mpi_job)
    engine, why = engine_choice.choose(available, 4 * MiB)
    faster = engine_choice.faster_engines(available, 4 * MiB)
    assert engine == expected
    if expected == COLLECTIVE:
        assert why == "the one engine this job can run"
        assert f"mpi ({ours}; needs Open MPI and a start as one MPI job" in faster
        assert f"horovod-mpi ({mpi}; needs Horovod built with MPI" in faster
        assert f"horovod-gloo ({gloo}; needs Horovod and a start by horovodrun" in faster
    elif expected == HOROVOD_GLOO:
        assert why == (f"the fastest engine this job can run, {gloo} TensorFlow's ring time at "
                       "4 MiB buckets")
        assert faster.startswith(f"mpi ({ours}") and "gloo" not in faster
    elif expected == HOROVOD_MPI:
        assert why.startswith(f"the fastest engine this job can run, {mpi}")
        assert faster.startswith(f"mpi ({ours}")
    else:
        assert why.startswith(f"the fastest engine this job can run, {ours}")
        assert faster == ""


@pytest.mark.parametrize("controller, mpi_job, backend", [
    (None, False, "collective"), ("gloo", False, "horovod"), ("mpi", False, "horovod"),
    (None, True, "mpi"), ("gloo", True, "mpi")])
def test_resolve_backend_auto_follows_the_launcher(monkeypatch, controller, mpi_job, backend):
    from tfdist import runtime  # pylint: disable=import-outside-toplevel
    from tfdist.strategies import ring  # pylint: disable=import-outside-toplevel

    monkeypatch.setattr(runtime, "horovod_controller", lambda: controller)
    monkeypatch.setattr(ring, "mpi_engine_runs", lambda: mpi_job)
    monkeypatch.setattr(ring, "horovod_available", lambda: True)
    chosen, why = ring.resolve_backend("auto", 4 * MiB)
    # one engine: no choice
    assert chosen == backend and (why is None) == (controller is None and not mpi_job)
    assert ring.resolve_backend("collective") == ("collective", None)
    monkeypatch.setattr(ring, "horovod_available", lambda: False)  # launched, not installed
    assert ring.resolve_backend("auto")[0] == ("mpi" if mpi_job else "collective")
    with pytest.raises(ValueError, match="backend must be one of"):
        ring.resolve_backend("nccl")


@pytest.mark.parametrize("environ, controller", [
    ({}, None),
    ({"HOROVOD_RANK": "0", "HOROVOD_SIZE": "2", "HOROVOD_GLOO_RENDEZVOUS_ADDR": "h"}, "gloo"),
    ({"HOROVOD_RANK": "0", "HOROVOD_SIZE": "2"}, "mpi"),
    ({"HOROVOD_RANK": "0", "HOROVOD_SIZE": "2", "HOROVOD_CPU_OPERATIONS": "GLOO"}, "gloo"),
])
def test_horovod_controller_from_the_launchers_environment(monkeypatch, environ, controller):
    from tfdist import runtime  # pylint: disable=import-outside-toplevel

    for name in ("HOROVOD_RANK", "HOROVOD_SIZE", "HOROVOD_GLOO_RENDEZVOUS_ADDR",
                 "HOROVOD_CPU_OPERATIONS"):
        monkeypatch.delenv(name, raising=False)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(runtime, "cluster", lambda: type("C", (), {"launcher": "tfdist-run"}))
    assert runtime.horovod_controller() == controller
