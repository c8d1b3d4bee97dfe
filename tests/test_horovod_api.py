"""`tfdist.horovod.keras`: a Horovod Keras script (per-rank shards, `DistributedOptimizer`,
`BroadcastGlobalVariablesCallback(0)`, `MetricAverageCallback()`) equals one process on the
concatenated batches, under every launcher.

tests/scripts/horovod_api.py trains four configurations in one launch (Adam on arrays; SGD
with momentum, op=Sum, on tf.data; two backward passes per step; an embedding with
sparse_as_dense) and runs Horovod's collectives. make test launches it once (mpirun, 2
processes, Horovod on MPI: make test's mpirun job); make test-all also under tfdist-run
(TensorFlow's collectives), horovodrun (Horovod on Gloo, 3 processes) and srun, and the
refusal of per-rank data of different lengths.
"""

import subprocess
import sys

import numpy as np
import pytest

from helpers import (failure_report, horovodrun, require_launcher, run_job, script, tfdist_run)

TOLERANCE = 1e-4
COLLECTIVE_RESULTS = ("allreduce_average", "allreduce_sum", "allreduce_max", "allgather",
                      "broadcast", "broadcast_uint8", "reducescatter", "topology", "objects")


def _reference(tmp_path_factory, world):
    prefix = str(tmp_path_factory.mktemp(f"horovod_reference_{world}") / "one")
    done = subprocess.run([sys.executable, script("horovod_api.py"), prefix,
                           "--world-of-reference", str(world)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return dict(np.load(f"{prefix}.rank0.npz"))


@pytest.fixture(scope="module")
def references(tmp_path_factory):
    cache = {}

    def get(world):
        if world not in cache:
            cache[world] = _reference(tmp_path_factory, world)
        return cache[world]

    return get


def _check_job(done, prefix, world, reference):
    assert done.returncode == 0, failure_report(done)
    ranks = [dict(np.load(f"{prefix}.rank{r}.npz")) for r in range(world)]
    trained = [k for k in reference
               if k not in COLLECTIVE_RESULTS + ("ported", "ported_tf")
               and "predict_rows" not in k]
    for rank, results in enumerate(ranks):
        worst = max(float(np.max(np.abs(reference[k] - results[k]))) for k in trained)
        assert worst <= TOLERANCE, f"rank {rank}: {worst} from one process"
        # Each rank predicts its own rows (Horovod's semantics): 48 rows / world.
        assert all(int(results[k]) == 48 // world for k in results if "predict_rows" in k)
        assert results["topology"][:2].tolist() == [world, rank]
        # Horovod's own Keras tests, ported (tests/scripts/horovod_ported.py), passed.
        assert results["ported"].tolist() == reference["ported"].tolist() and len(
            results["ported"]) == 7
        # Horovod's own TensorFlow 2 tests that apply on CPUs (horovod_tf_ported.py), passed.
        assert results["ported_tf"].tolist() == reference["ported_tf"].tolist() and len(
            results["ported_tf"]) == 7
        np.testing.assert_allclose(results["allreduce_average"], [(world - 1) / 2] * 3)
        np.testing.assert_allclose(results["allreduce_sum"], [world * (world - 1) / 2] * 3)
        np.testing.assert_allclose(results["allreduce_max"], [world - 1] * 3)
        assert results["allgather"].tolist() == [[r, r] for r in range(world)
                                                 for _ in range(r + 1)]
        np.testing.assert_allclose(results["broadcast"], [world + 9] * 2)
        assert results["broadcast_uint8"].tolist() == [200] * 3
        total = np.arange(5.0) * sum(range(1, world + 1))
        # Horovod's split: the first 5 % world ranks get one row more.
        sizes = [5 // world + (r < 5 % world) for r in range(world)]
        start = sum(sizes[:rank])
        np.testing.assert_allclose(results["reducescatter"], total[start:start + sizes[rank]])
    return done


@pytest.mark.horovod
def test_two_processes_under_mpirun_on_the_mpi_engine_equal_one_process(references, tmp_path):
    """mpirun, 2 processes (as Horovod's users run it; this is also make test's mpirun job;
    "auto" takes Open MPI's own collectives there, `tfdist.comm.mpi`, no longer Horovod's
    MPI engine): weights, history, evaluate within 1e-4 of one process on the concatenated
    batches; collectives as Horovod's; compile's Keras 2 argument said once."""
    require_launcher("mpirun")
    prefix = str(tmp_path / "job")
    done = run_job("mpirun", 2, [script("horovod_api.py"), prefix], timeout=900)
    _check_job(done, prefix, 2, references(2))
    output = done.stdout + done.stderr
    assert "launched by mpirun: aggregator ring on mpi (backend 'auto'" in output, output[-3000:]
    assert output.count("compile(experimental_run_tf_function=False) ignored") == 1, output[-3000:]
    assert "each process feeding its own batches (Horovod's semantics)" in output


@pytest.mark.slow  # make test-all (make test stays within 20 min: tests/tiers.py)
def test_two_processes_on_tf_collectives_equal_one_process(references, tmp_path):
    """tfdist-run, 2 processes: TensorFlow's collectives."""
    prefix = str(tmp_path / "job")
    done = tfdist_run(2, [script("horovod_api.py"), prefix], timeout=600,
                      launcher=["--no-mpi", "--no-horovod"])  # neither Open MPI nor Horovod
    _check_job(done, prefix, 2, references(2))
    assert "aggregator ring on collective" in done.stdout + done.stderr


@pytest.mark.slow  # make test-all (make test stays within 20 min: tests/tiers.py)
@pytest.mark.horovod
def test_three_processes_under_horovodrun_on_horovods_engine(references, tmp_path):
    prefix = str(tmp_path / "job")
    done = horovodrun(3, [script("horovod_api.py"), prefix], timeout=900)
    _check_job(done, prefix, 3, references(3))
    assert "aggregator ring on horovod-gloo" in done.stdout + done.stderr


@pytest.mark.slow  # make test-all
def test_two_processes_under_srun(references, tmp_path):
    require_launcher("srun")
    prefix = str(tmp_path / "job")
    done = run_job("srun", 2, [script("horovod_api.py"), prefix], timeout=900)
    _check_job(done, prefix, 2, references(2))


@pytest.mark.slow  # make test-all
def test_ranks_with_different_numbers_of_batches_are_refused(tmp_path):
    """Per-rank data of different lengths without steps_per_epoch: a clear error naming the
    counts, not a hang (Horovod would wait on the longer rank)."""
    done = tfdist_run(2, [script("horovod_api.py"), str(tmp_path / "job"), "--configs", "adam",
                          "--uneven"], timeout=600, run_timeout=60)
    assert done.returncode != 0
    assert "different numbers of batches per epoch (by rank: [4, 3])" in (
        done.stdout + done.stderr), failure_report(done)
