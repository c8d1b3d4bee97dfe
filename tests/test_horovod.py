"""Horovod: its ring as tfdist's backend, and horovodrun launching tfdist strategies.

`make install` builds Horovod, so these tests run (they are not skipped) and
fail loudly if Horovod is missing. Equivalence is the same contract as
test_equivalence: every world size reproduces the single-process training.
"""

import json
import os

import numpy as np
import pytest

from helpers import (REPO, failure_report, horovodrun, max_abs_difference, only_configs, script,
                     tfdist_run)

pytestmark = pytest.mark.horovod  # every test here needs Horovod (make install builds it)

TOLERANCE = 1e-4
FP16_TOLERANCE = 2e-2
CONFIGS = "adam,adam_tfdata"  # the latter: shuffled tf.data, steps_per_execution=2


def train(launch, world, prefix, *options):
    done = launch(world, [script("train_equivalence.py"), prefix, "--configs", CONFIGS,
                          *options], timeout=900)
    assert done.returncode == 0, failure_report(done)
    return done, [dict(np.load(f"{prefix}.rank{r}.npz")) for r in range(world)]


@pytest.fixture(scope="module")
def reference(one_process_run):
    return only_configs(one_process_run(), CONFIGS.split(","))


def horovod_tfdist_run(np_, script_args, **kwargs):
    return tfdist_run(np_, script_args, launcher=["--horovod"], **kwargs)


# 3 processes: test_auto_backend_picks_horovod_under_horovodrun (the same engine) in make test.
@pytest.mark.parametrize("world", [pytest.param(2, marks=pytest.mark.slow),
                                   pytest.param(3, marks=pytest.mark.slow),
                                   pytest.param(4, marks=pytest.mark.slow)])
def test_horovod_backend_under_horovodrun_matches_one_process(reference, tmp_path, world):
    done, ranks = train(horovodrun, world, str(tmp_path / "run"), "--backend", "horovod")
    assert "backend horovod" in done.stdout
    assert max_abs_difference(reference, ranks[0]) <= TOLERANCE
    for other in ranks[1:]:
        assert max_abs_difference(ranks[0], other) <= 1e-6


def test_auto_backend_picks_horovod_under_horovodrun(reference, tmp_path):
    """backend="auto" under horovodrun is Horovod's ring on Gloo, the fastest engine that
    launcher makes available, said in the chief's start-up line; 3 processes match one."""
    done, ranks = train(horovodrun, 3, str(tmp_path / "run"))
    assert "backend horovod" in done.stdout
    assert ("aggregator ring on horovod-gloo (backend 'auto': the fastest engine this job can "
            "run" in done.stdout + done.stderr), failure_report(done)
    assert max_abs_difference(reference, ranks[0]) <= TOLERANCE
    for other in ranks[1:]:
        assert max_abs_difference(ranks[0], other) <= 1e-6


@pytest.mark.slow  # make test-all (make test stays within 20 min: tests/tiers.py)
def test_collective_backend_under_horovodrun_matches_one_process(reference, tmp_path):
    # TF collectives need worker addresses: exchanged through Horovod.
    done, ranks = train(horovodrun, 3, str(tmp_path / "run"), "--backend", "collective")
    assert "backend collective" in done.stdout
    assert max_abs_difference(reference, ranks[0]) <= TOLERANCE


@pytest.mark.slow  # make test-all (make test stays within 20 min: tests/tiers.py)
def test_tfdist_run_launches_the_horovod_backend_and_fp16_stays_close(reference, tmp_path):
    done, ranks = train(horovod_tfdist_run, 2, str(tmp_path / "run"),
                        "--backend", "horovod", "--compression", "fp16")
    assert "backend horovod" in done.stdout
    weights = {k: v for k, v in reference.items() if "/w" in k}
    diff = max_abs_difference(weights, {k: ranks[0][k] for k in weights})
    assert 0 < diff <= FP16_TOLERANCE, f"fp16 weights differ from float32 by {diff}"
    assert max_abs_difference(ranks[0], ranks[1]) <= 1e-6


@pytest.mark.parametrize("backend", ["horovod", pytest.param("collective", marks=pytest.mark.slow)])
def test_fp16_compression_halves_the_bytes_on_the_wire(tmp_path, backend):
    out = tmp_path / "wire.json"
    worker = os.path.join(REPO, "benchmarks", "wire_bytes.py")  # also run by make bench
    done = horovod_tfdist_run(2, [worker, str(out), backend], timeout=300)
    assert done.returncode == 0, failure_report(done)
    result = json.loads(out.read_text())
    # A 2-process ring sends the payload once per rank each way: ~2x payload in all.
    assert result["none"]["wire_bytes_per_all_reduce"] >= 1.9 * result["none"]["payload_bytes"]
    assert 0.45 <= result["fp16_over_none"] <= 0.55, result
    assert result["fp16"]["dtype"] == "float32"
    assert result["none"]["max_abs_error"] <= 1e-5
    assert result["fp16"]["max_abs_error"] <= 2e-3  # inputs in [0, 1), sums < 2: fp16 ulp


@pytest.mark.parametrize("backend", ["horovod", pytest.param("collective", marks=pytest.mark.slow)])
def test_collectives_keep_their_contract_on_both_engines(backend):
    done = horovod_tfdist_run(3, [script("collectives_contract.py"), backend], timeout=300)
    assert done.returncode == 0, failure_report(done)
    assert "collectives contract ok" in done.stdout


@pytest.mark.slow  # make test-all (make test stays within 20 min: tests/tiers.py)
def test_dead_rank_under_horovodrun_fails_the_job(tmp_path):
    done = horovodrun(3, [script("failure_modes.py"), "crash", "2"], timeout=120,
                      run_timeout=30)
    assert done.returncode != 0
    output = done.stdout + done.stderr
    assert "crashing on purpose" in output
    assert "Process 2 exit with status code 3" in output, output[-3000:]  # horovodrun names it


def test_horovod_backend_without_horovod_launch_is_a_clear_error():
    # --no-mpi too: in an MPI job a Horovod built with MPI runs on MPI, as under mpirun
    done = tfdist_run(2, [script("train_equivalence.py"), "/nonexistent/out", "--backend",
                          "horovod"], timeout=120, launcher=["--no-horovod", "--no-mpi"])
    assert done.returncode != 0
    assert ("needs processes started by horovodrun, tfdist-run (without --no-horovod, with "
            "Horovod installed), or mpirun") in done.stdout, done.stdout[-3000:]
