"""The MPI engine (`tfdist.comm.mpi`): Open MPI's collectives from compiled ops, and tfdist-run's
MPI job (`tfdist.launch.mpi_job`) that lets plain `tfdist-run` use it.

`make install` brings Open MPI and builds the engine's ops, so these run (not skipped). The
equivalence of whole trainings on this engine is also covered by every tfdist-run launch
of the other suites: plain tfdist-run starts its ranks through mpirun, and "auto" takes
this engine (test_sharded_optimizer's 2-process job checks that choice in make test). The units run in the in-process tier, the tests marked `launches` in the
process tier.
"""

import os
import subprocess
import sys

import numpy as np
import pytest

from helpers import (failure_report, max_abs_difference, only_configs, require_launcher, run_job,
                     script, tfdist_run)
from tfdist import env_vars
from tfdist.launch import mpi_job

TOLERANCE = 1e-4
CONFIGS = "adam,adam_tfdata"


# ------------------------------------------------------------------ in-process units
def test_the_mpi_job_environment_keeps_what_ranks_share_and_names_the_rank_variables():
    envs = [{"A": "same", "TFDIST_RANK": str(r), "HOROVOD_RANK": str(r), "SIZE": "2"}
            for r in range(2)]
    common = mpi_job.environment(envs)
    assert common["A"] == "same" and common["SIZE"] == "2"
    assert "TFDIST_RANK" not in common and "HOROVOD_RANK" not in common
    assert common[env_vars.RANK_VARIABLES.name] == "HOROVOD_RANK,TFDIST_RANK"
    assert common[mpi_job.PMIX_SECURITY] == "native"  # not munge's 2.4 s of retries
    envs[0][mpi_job.PMIX_SECURITY] = envs[1][mpi_job.PMIX_SECURITY] = "munge"
    assert mpi_job.environment(envs)[mpi_job.PMIX_SECURITY] == "munge"


def test_a_variable_that_differs_across_ranks_other_than_the_rank_is_refused():
    envs = [{"TFDIST_RANK": str(r), "PORT": str(5000 + r)} for r in range(2)]
    with pytest.raises(ValueError, match="PORT differs across the ranks"):
        mpi_job.environment(envs)


def test_rank_tags_become_labels_and_mpiruns_own_lines_keep_its_label():
    assert mpi_job.split_label("[tfdist-rank 3] epoch 1\n") == ("3", "epoch 1\n")
    assert mpi_job.split_label("Primary job terminated\n") == (None, "Primary job terminated\n")


@pytest.mark.launches  # a Python process (no TensorFlow)
def test_a_rank_sets_every_rank_variable_from_mpiruns_rank_and_tags_whole_lines():
    env = dict(os.environ, OMPI_COMM_WORLD_RANK="1",
               **{env_vars.RANK_VARIABLES.name: "TFDIST_RANK,HOROVOD_RANK"})
    child = ("import os, sys; sys.stdout.write('a'); sys.stdout.flush(); "
             "print('b', os.environ['TFDIST_RANK'], os.environ['HOROVOD_RANK']); "
             "print('no newline at the end', end=''); sys.exit(3)")
    done = subprocess.run([sys.executable, "-m", "tfdist.launch.mpi_rank", sys.executable, "-c",
                           child], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 3, done.stderr
    assert done.stdout.splitlines() == ["[tfdist-rank 1] ab 1 1",
                                        "[tfdist-rank 1] no newline at the end",
                                        "[tfdist-rank 1 exited 3]"]
    assert mpi_job.split_label("[tfdist-rank 1 exited 3]\n") == ("1", None)


def test_tfdist_run_starts_an_mpi_job_only_where_each_rank_has_a_cpu(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    assert mpi_job.fits_the_cpus(2) and not mpi_job.fits_the_cpus(3)


@pytest.mark.launches  # tfdist-run refusing its flags (no TensorFlow)
def test_mpi_flags_are_refused_where_mpirun_cannot_go():
    for flags in (["--mpi", "--keep-going"], ["--mpi", "--min-np", "1"]):
        done = subprocess.run([sys.executable, "-m", "tfdist.launch", "-np", "2", *flags,
                               sys.executable, "-c", "pass"], capture_output=True, text=True,
                              timeout=60)
        assert done.returncode == 2 and "--mpi cannot go with" in done.stderr, done.stderr


# ------------------------------------------------------------------ processes
@pytest.mark.launches
@pytest.mark.parametrize("world", [2, pytest.param(3, marks=pytest.mark.slow)])
def test_collectives_keep_their_contract_on_the_mpi_engine(world):
    # --mpi: 3 ranks, more than this machine's 2 CPUs, would start one by one by default
    # (and poll: make test-all)
    done = tfdist_run(world, [script("collectives_contract.py"), "mpi"], timeout=300,
                      launcher=["--mpi"])
    assert done.returncode == 0, failure_report(done)
    assert "collectives contract ok" in done.stdout
    assert "[tfdist-rank" not in done.stdout  # every line relabelled


@pytest.fixture(scope="module")
def reference(one_process_run):
    return only_configs(one_process_run(), CONFIGS.split(","))


def assert_on_the_mpi_engine_like_one_process(done, launcher, prefix, reference):
    assert done.returncode == 0, failure_report(done)
    assert f"launched by {launcher}: aggregator ring on mpi (backend 'auto'" in (
        done.stdout + done.stderr), failure_report(done)
    ranks = [dict(np.load(f"{prefix}.rank{r}.npz")) for r in range(2)]
    assert max_abs_difference(reference, ranks[0]) <= TOLERANCE
    assert max_abs_difference(ranks[0], ranks[1]) <= 1e-6


@pytest.mark.slow  # make test: test_sharded_optimizer's 2-process job is plain tfdist-run's
@pytest.mark.launches  # choice of this engine, equal to the plain script
def test_plain_tfdist_run_takes_the_mpi_engine_and_matches_one_process(reference, tmp_path):
    prefix = str(tmp_path / "auto")
    done = tfdist_run(2, [script("train_equivalence.py"), prefix, "--configs", CONFIGS],
                      timeout=900)
    assert_on_the_mpi_engine_like_one_process(done, "tfdist-run", prefix, reference)


@pytest.mark.slow  # make test-all, where a Slurm runs (scripts/local_slurm.sh)
@pytest.mark.launches
def test_srun_with_pmix_takes_the_mpi_engine_and_matches_one_process(reference, tmp_path):
    require_launcher("srun")
    prefix = str(tmp_path / "srun")
    done = run_job("srun-pmix", 2, [script("train_equivalence.py"), prefix, "--configs", CONFIGS],
                   timeout=900)
    assert_on_the_mpi_engine_like_one_process(done, "srun", prefix, reference)


@pytest.mark.launches
def test_a_failing_rank_is_named_with_its_exit_code_as_without_mpirun(tmp_path):
    path = tmp_path / "fails.py"
    # rank 1 fails once rank 0 has said hello (else the abort may stop rank 0 before it does)
    said = tmp_path / "rank0-said-hello"
    path.write_text(f"import os, sys, time\nprint('hello', flush=True)\n"
                    f"if os.environ['TFDIST_RANK'] == '0': open({str(said)!r}, 'w').close()\n"
                    f"deadline = time.monotonic() + 60\n"
                    f"while not os.path.exists({str(said)!r}) and time.monotonic() < deadline:\n"
                    f"    time.sleep(0.05)\n"
                    f"sys.exit(3 if os.environ['TFDIST_RANK'] == '1' else 0)\n")
    done = tfdist_run(2, [str(path)], timeout=120)
    assert done.returncode == 3, failure_report(done)
    assert "tfdist-run: rank 1 exited with code 3" in done.stderr, failure_report(done)
    assert "[0] hello" in done.stdout and "[1] hello" in done.stdout
    assert "abort is already in progress" not in done.stdout, failure_report(done)


@pytest.mark.launches
def test_a_rank_out_of_step_ends_the_job_within_the_timeout_naming_it(tmp_path):
    code = ("import time, tensorflow as tf, tfdist\n"
            "s = tfdist.strategies.RingAllReduceStrategy(backend='mpi')\n"
            "comm = s.extended.communicator\n"
            "if s.rank == 1:\n    time.sleep(600)\n"
            "step = tf.function(lambda: comm.all_reduce(tf.ones([3])))\n"
            "with comm.expect_progress('the test step'):\n    step()\n")
    path = tmp_path / "out_of_step.py"
    path.write_text(code)
    done = tfdist_run(2, [str(path)], run_timeout=20, timeout=300)
    assert done.returncode != 0
    output = done.stdout + done.stderr
    assert "rank 0" in output and "MPI cannot abort its collectives" in output, output[-3000:]
