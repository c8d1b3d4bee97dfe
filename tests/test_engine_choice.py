"""`backend="auto"`: the fastest engine the job can run, from the measured engine curves."""

import json
import os

import pytest

from tfdist.comm import engines as engine_choice
from tfdist.comm.engines import COLLECTIVE, HOROVOD_GLOO, HOROVOD_MPI, MPI

RESULTS = os.path.join(os.path.dirname(__file__), os.pardir, "benchmarks", "results")
MiB = 2**20


def test_the_table_is_the_committed_benchmark_result():
    """Re-running `tfdist-bench --only engines` and committing a different order must
    change the choice: the table and the result file may not drift apart."""
    with open(os.path.join(RESULTS, "engine_curves.json")) as f:
        summary = json.load(f)["summary"]
    for engine, key in ((MPI, "mpi_engine"), (HOROVOD_MPI, "mpi"), (HOROVOD_GLOO, "gloo")):
        assert engine_choice.TRANSPORTS[engine].over_tf_ring == {
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
            engine_choice.TRANSPORTS[engine].over_tf_ring[measured_at])
    assert engine_choice.relative_time(COLLECTIVE, nbytes) == 1.0


def _runnable(launched, controller, mpi_job):
    """What `engines.runnable` answers for a process so launched (the launcher's facts and
    the MPI engine's ops, as the registered engines ask them)."""
    cluster = type("C", (), {"launcher": "mpirun" if mpi_job or controller == "mpi" else
                             "tfdist-run", "rank": 0, "world_size": 2})
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(engine_choice, "launched_as_mpi_job", lambda _: mpi_job)
        patch.setattr(engine_choice, "launched_with_horovod", lambda _: launched)
        patch.setattr(engine_choice, "horovod_controller", lambda _: controller or None)
        patch.setattr("tfdist.comm.mpi.unavailable_reason", lambda _: None)
        patch.setattr("tfdist.comm.horovod.horovod_available", lambda: True)
        available, missing = engine_choice.runnable(cluster)
    assert not missing
    return available


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
    available = _runnable(launched, transport, mpi_job)
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


@pytest.mark.parametrize("engines, backend", [
    ((COLLECTIVE,), "collective"), ((HOROVOD_GLOO, COLLECTIVE), "horovod"),
    ((HOROVOD_MPI, COLLECTIVE), "horovod"), ((MPI, COLLECTIVE), "mpi"),
    ((MPI, HOROVOD_GLOO, COLLECTIVE), "mpi")])
def test_resolve_backend_auto_takes_the_fastest_agreed_engine(monkeypatch, engines, backend):
    from tfdist import runtime  # pylint: disable=import-outside-toplevel
    from tfdist.comm.rank_agreement import Agreement  # pylint: disable=import-outside-toplevel
    from tfdist.strategies import ring  # pylint: disable=import-outside-toplevel

    monkeypatch.setattr(runtime, "job_agreement", lambda: Agreement(engines, {}, None))
    chosen, why = ring.resolve_backend("auto", 4 * MiB)
    assert chosen == backend and (why is None) == (len(engines) == 1)  # one engine: no choice
    assert ring.resolve_backend("collective") == ("collective", None)
    with pytest.raises(ValueError, match="backend must be one of"):
        ring.resolve_backend("nccl")


def test_resolve_backend_names_a_faster_engine_some_rank_cannot_run(monkeypatch):
    """A host without the MPI engine's compiler: every rank takes Horovod, and the start-up
    line says which rank could not run the MPI engine and why."""
    from tfdist import runtime  # pylint: disable=import-outside-toplevel
    from tfdist.comm import rank_agreement  # pylint: disable=import-outside-toplevel
    from tfdist.strategies import ring  # pylint: disable=import-outside-toplevel

    versions = {"tfdist": "1", "tensorflow": "2", "keras": "3"}
    agreement = rank_agreement.settle(0, [
        rank_agreement.proposal((MPI, HOROVOD_MPI, COLLECTIVE), {}, versions),
        rank_agreement.proposal((HOROVOD_MPI, COLLECTIVE), {MPI: "no mpicxx on PATH"},
                                versions)])
    monkeypatch.setattr(runtime, "job_agreement", lambda: agreement)
    chosen, why = ring.resolve_backend("auto", 4 * MiB)
    assert chosen == "horovod"
    assert "not mpi: rank 1 cannot run it: no mpicxx on PATH" in why


def test_ranks_that_run_different_versions_fail_naming_them():
    from tfdist.comm import rank_agreement  # pylint: disable=import-outside-toplevel
    from tfdist.errors import ClusterError  # pylint: disable=import-outside-toplevel

    ours = {"tfdist": "0.1.0", "tensorflow": "2.21.0", "keras": "3.15.1"}
    theirs = dict(ours, tensorflow="2.18.1")
    proposals = [rank_agreement.proposal((COLLECTIVE,), {}, v, secret)
                 for v, secret in ((ours, "s3cret"), (ours, None), (theirs, None))]
    with pytest.raises(ClusterError, match=r"rank 2: keras 3.15.1, tensorflow 2.18.1"):
        rank_agreement.settle(1, proposals)
    agreed = rank_agreement.settle(1, proposals[:2])
    assert agreed.secret == "s3cret" and agreed.engines == (COLLECTIVE,)
    for bad in ("", "[]", '{"engines": []}', "garbage"):
        with pytest.raises(ValueError):
            rank_agreement.check_proposal(bad, 1)
    rank_agreement.check_proposal(proposals[0], 0)


@pytest.mark.parametrize("environ, controller", [
    ({}, None),
    ({"HOROVOD_RANK": "0", "HOROVOD_SIZE": "2", "HOROVOD_GLOO_RENDEZVOUS_ADDR": "h"}, "gloo"),
    ({"HOROVOD_RANK": "0", "HOROVOD_SIZE": "2"}, "mpi"),
    ({"HOROVOD_RANK": "0", "HOROVOD_SIZE": "2", "HOROVOD_CPU_OPERATIONS": "GLOO"}, "gloo"),
])
def test_horovod_controller_from_the_launchers_environment(monkeypatch, environ, controller):
    for name in ("HOROVOD_RANK", "HOROVOD_SIZE", "HOROVOD_GLOO_RENDEZVOUS_ADDR",
                 "HOROVOD_CPU_OPERATIONS"):
        monkeypatch.delenv(name, raising=False)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    assert engine_choice.horovod_controller(type(
        "C", (), {"launcher": "tfdist-run", "rank": 0, "world_size": 2})) == controller


def test_an_engine_is_one_registration(monkeypatch):
    """A new engine is its module and one `register`: a backend value of the strategy, agreed
    on, priced, chosen by "auto" where it is fastest, and refused by its own reason."""
    from tfdist.strategies import ring  # pylint: disable=import-outside-toplevel

    monkeypatch.setattr(engine_choice, "ENGINES", dict(engine_choice.ENGINES))
    monkeypatch.setattr(engine_choice, "TRANSPORTS", dict(engine_choice.TRANSPORTS))
    monkeypatch.setattr(engine_choice, "_ENGINE_OF", dict(engine_choice._ENGINE_OF))  # pylint: disable=protected-access
    engine_choice.register(engine_choice.Engine(
        name="oneccl", transports=(engine_choice.Transport("oneccl", {4096: 0.1}, "oneCCL"),),
        runs=lambda cluster: (("oneccl",), {}), refusal=lambda cluster: None,
        start=lambda cluster, port, options: None, reduces_scatter=True))
    with pytest.raises(ValueError, match="registered already"):
        engine_choice.register(engine_choice.ENGINES["oneccl"])
    assert "oneccl" in engine_choice.names(reduces_scatter=True)
    assert engine_choice.choose(("mpi", "oneccl", "collective"), 4 * MiB)[0] == "oneccl"
    assert engine_choice.engine_of("oneccl") == "oneccl"
    with pytest.raises(ValueError, match=r"engine must be one of \('mpi', 'horovod', "
                                         r"'collective', 'oneccl'\)"):
        engine_choice.engine("nccl")
    assert ring.resolve_backend("oneccl") == ("oneccl", None)
