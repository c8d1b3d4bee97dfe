"""Asynchronous parameter server (Downpour) and SSP: no update lost, staleness bounded, trains,
backs up the servers' optimizer state, takes a preemption notice."""

import json
import os
import re
import signal

import numpy as np
import pytest

from helpers import failure_report, horovodrun, script, start_job, tfdist_run
from tfdist.fault_tolerance.preemption import PREEMPTED_EXIT_CODE

TOLERANCE = 1e-5


def run(tmp_path, workers, servers, *options):
    prefix = str(tmp_path / "async")
    launcher = ["--num-servers", str(servers)] if servers else []
    done = tfdist_run(workers, [script("async_training.py"), prefix, *options], timeout=600,
                      run_timeout=120, launcher=launcher)
    assert done.returncode == 0, failure_report(done)
    ranks = []
    for rank in range(workers):
        with open(f"{prefix}.rank{rank}.json") as f:
            ranks.append(json.load(f))
    return ranks


@pytest.mark.parametrize("workers,servers,staleness,straggler", [
    pytest.param(1, 0, "none", -1, marks=pytest.mark.slow),  # one worker is one process
    # Downpour, co-located servers, rank 1 slower (make test-all; make test: the store's
    # accounting in-process, test_async_store_in_process.py, and the real model below).
    pytest.param(2, 0, "none", 1, marks=pytest.mark.slow),
    pytest.param(3, 2, "1", 1, marks=pytest.mark.slow),  # SSP, dedicated servers
    # Lock-step (tau 0; make test-all: the gate's tau 0 is checked in-process,
    # test_async_store_in_process.py).
    pytest.param(3, 1, "0", 2, marks=pytest.mark.slow),
])
def test_every_update_is_applied_once(tmp_path, workers, servers, staleness, straggler):
    """The gradient does not depend on the weights: the end is one process's end, exactly."""
    ranks = run(tmp_path, workers, servers, "constant", "--staleness", staleness,
                "--straggler", str(straggler))
    for result in ranks:
        difference = np.max(np.abs(np.array(result["weights"]) - np.array(result["expected"])))
        assert difference <= TOLERANCE, f"rank {result['rank']}: {difference}"
        if staleness != "none":
            assert max(result["history"]["staleness_max"]) <= int(staleness), result["history"]
    # Every push is counted once where it was applied (one variable: one server holds it).
    steps_per_worker = 3 * 96 // 12  # epochs x batches (async_training.py's constant job)
    applied = [server["updates_applied"] for server in ranks[0]["server_stats"]]
    if workers > 1:
        assert max(applied) == workers * steps_per_worker, applied
    if staleness == "0":
        assert all(max(r["history"]["staleness_max"]) == 0 for r in ranks)
    if staleness == "1":  # the fast workers ran ahead (and waited) while rank 1 slept
        fast = [r for r in ranks if r["rank"] != straggler]
        assert max(max(r["history"]["staleness_max"]) for r in fast) == 1
        assert max(max(r["history"]["ps_wait_ms"]) for r in fast) > 0


def test_async_trains_a_real_model_and_evaluates_the_servers_parameters(tmp_path):
    ranks = run(tmp_path, 2, 0, "real", "--staleness-aware")
    loss = ranks[0]["history"]["loss"]
    assert loss[-1] < 0.5 * loss[0], loss
    assert ranks[0]["evaluate"]["accuracy"] > 0.8
    # evaluate and predict wait for every worker and read the servers: ranks agree.
    for other in ranks[1:]:
        assert other["evaluate"] == ranks[0]["evaluate"]
        assert other["history"]["val_loss"] == ranks[0]["history"]["val_loss"]
        np.testing.assert_array_equal(other["predictions"], ranks[0]["predictions"])
        for mine, theirs in zip(ranks[0]["weights"], other["weights"]):
            np.testing.assert_array_equal(mine, theirs)


@pytest.mark.slow  # make test-all (make test stays within 20 min: tests/tiers.py)
def test_a_dead_worker_lets_the_others_finish_and_fails_the_job_at_the_end(tmp_path):
    """SSP with a dedicated server: the gate and the evaluate barrier stop waiting for it."""
    prefix = str(tmp_path / "async")
    done = tfdist_run(3, [script("async_training.py"), prefix, "real", "--staleness", "1",
                          "--die", "2"], timeout=600, run_timeout=60,
                      launcher=["--num-servers", "1", "--keep-going"])
    output = done.stdout + done.stderr
    assert done.returncode == 137, failure_report(done)
    assert "rank 2 exited with code 137; the other workers go on (--keep-going)" in output
    assert "worker rank 2 (" in output and "died during asynchronous training" in output
    survivors = []
    for rank in (0, 1):
        with open(f"{prefix}.rank{rank}.json") as f:
            survivors.append(json.load(f))
    assert len(survivors[0]["history"]["loss"]) == 4  # every epoch ran
    assert survivors[0]["evaluate"] == survivors[1]["evaluate"]


@pytest.mark.slow  # make test-all (make test stays within 20 min: tests/tiers.py)
def test_a_notice_backs_up_the_servers_optimizer_state_and_the_rerun_continues_it(tmp_path):
    """SIGTERM to worker 1 of 2 (SSP, a dedicated server) mid-epoch: the flag rides its next
    push, worker 0 gets it with its next pull, both stop, the chief backs up the servers'
    parameters, momentum and step count, every worker exits 42. The same command again
    resumes: with every push carrying the same gradient, the weights end where the servers'
    step count of that optimizer ends only if the momentum and the schedule's step survived
    (without them they end 3.1 away)."""
    prefix, backup = str(tmp_path / "async"), str(tmp_path / "backup")
    command = [script("async_training.py"), prefix, "momentum", "--backup", backup,
               "--staleness", "1"]
    launcher = ["--num-servers", "1"]
    job = start_job("tfdist-run", 2, command + ["--announce"], run_timeout=60, launcher=launcher)
    seen, signalled = [], False
    try:
        for line in job.stdout:
            seen.append(line)
            match = re.search(r"rank 1 pid (\d+) step 10\b", line)
            if match and not signalled:
                os.kill(int(match.group(1)), signal.SIGTERM)
                signalled = True
        job.wait(timeout=120)
    finally:
        job.kill()
    output = "".join(seen)
    assert job.returncode == PREEMPTED_EXIT_CODE, output[-4000:]
    assert "rank 1 received SIGTERM" in output, output[-4000:]
    assert "tfdist: preempted: backed up at epoch 2" in output, output[-4000:]
    done = tfdist_run(2, command, timeout=600, run_timeout=60, launcher=launcher)
    assert done.returncode == 0, failure_report(done)
    assert "resuming from the backup" in done.stdout, failure_report(done)
    for rank in range(2):
        with open(f"{prefix}.rank{rank}.json") as f:
            result = json.load(f)
        assert result["server_steps"] > 2 * 3 * 8 - 2 * 10  # the backup's steps are counted
        np.testing.assert_allclose(result["weights"], result["expected"], atol=TOLERANCE)


@pytest.mark.slow  # make test-all: co-located servers and horovodrun each run in make test
@pytest.mark.horovod
def test_async_under_horovodrun_with_co_located_servers(tmp_path):
    prefix = str(tmp_path / "async")
    done = horovodrun(2, [script("async_training.py"), prefix, "constant", "--staleness", "1"],
                      timeout=600)
    assert done.returncode == 0, failure_report(done)
    for rank in range(2):
        with open(f"{prefix}.rank{rank}.json") as f:
            result = json.load(f)
        assert np.max(np.abs(np.array(result["weights"]) - np.array(result["expected"]))) \
            <= TOLERANCE
