"""Optimizer-state sharding as processes on the real engines: the plain script's results.

tests/scripts/sharded_optimizer.py's cases (test_sharded_optimizer_in_process.py runs every
one at simulated ranks) as 3 processes under tfdist-run on TensorFlow's collectives with
oneDNN forced off (the parameters' all-gather and the norms' all-reduce inside the compiled
step, ModelCheckpoint and model.save on every rank writing through the chief's file): the
same weights, history, evaluation, predictions and loaded-and-trained model as the plain
script within 1e-4, and about 1/3 of the optimizer's bytes per rank; the same as 2 processes
under plain tfdist-run, on the MPI engine "auto" takes there. make test-all: every
case as 4 processes; under horovodrun, "auto" on Horovod's engine with a bucket per variable.
"""

import os
import re
import subprocess
import sys

import pytest

from helpers import (assert_ranks_match_reference, assert_same_keras_file_arrays,
                     failure_report, horovodrun, load_ranks, onednn, run_case_script, script,
                     tfdist_run)

# make test: a LossScaleOptimizer with EMA and accumulation (the norms' all-reduce in a
# cond), the custom loop and the saves - the rest of the cases run in-process.
FAST_CASES = "loss_scale_ema_accumulation,custom_loop_adam,save_and_load"
RTOL, ATOL = 1e-5, 1e-4


def every_case():
    """The cases tests/scripts/sharded_optimizer.py defines, comma-separated."""
    with open(script("sharded_optimizer.py"), encoding="utf-8") as source:
        return ",".join(re.findall(r"^def case_(\w+)\(", source.read(), flags=re.MULTILINE))


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    """The plain script's arrays per list of cases (run once each)."""
    runs = {}

    def reference(cases):
        if cases not in runs:
            directory = tmp_path_factory.mktemp("plain")
            done = subprocess.run(
                [sys.executable, script("sharded_optimizer.py"), str(directory / "out"),
                 "--strategy", "plain", "--cases", cases, "--workdir", str(directory)],
                capture_output=True, text=True, timeout=900)
            assert done.returncode == 0, done.stderr[-3000:]
            runs[cases] = load_ranks(str(directory / "out"), 1)[0], directory
        return runs[cases]

    return reference


def assert_like_plain(reference, ranks, per_variable=False):
    """Rank 0 equals the plain script, every rank rank 0; each rank's optimizer bytes are
    about 1/P of the plain optimizer's (the step count and rate are whole)."""
    def state(arrays):
        return {k: v for k, v in arrays.items() if not k.endswith("/optimizer_bytes")}

    assert_ranks_match_reference(state(reference), [state(r) for r in ranks],
                                 lambda key: (RTOL, ATOL), "the plain script")
    for key, value in reference.items():
        if key.endswith("/optimizer_bytes"):
            for rank, arrays in enumerate(ranks):
                # sharding="parameters" cuts each variable on its own: a little more
                allowed = int(value) / len(ranks) * (1.1 if per_variable else 1.0) + 64
                assert int(arrays[key]) <= allowed, (rank, key)


def sharded_run(tmp_path, world, cases, args, launcher=None, extra_env=None,
                strategy="sharded"):
    workdir = tmp_path / "work"
    os.makedirs(workdir, exist_ok=True)
    return run_case_script("sharded_optimizer.py", str(tmp_path / f"np{world}"), world,
                           ["--strategy", strategy, "--workdir", str(workdir)] + args,
                           cases, launcher, extra_env)


def test_parameters_sharded_on_the_mpi_engine_equal_the_plain_script(plain, tmp_path):
    """sharding="parameters" (ZeRO stage 3) as 2 processes under plain tfdist-run (Open MPI's
    engine): each layer's parameters all-gathered where the layer reads them, their
    gradients reduce-scattered in the backward pass (MPI_Reduce_scatter_block), the update
    on the stored slices; the same arrays and files as the plain script."""
    ranks = sharded_run(tmp_path, 2, FAST_CASES, [], launcher=tfdist_run,
                        extra_env=onednn("1"), strategy="parameters")
    reference, plain_directory = plain(FAST_CASES)
    assert_like_plain(reference, ranks, per_variable=True)
    for file in ("best.keras", "model.keras", "model.weights.h5"):
        assert_same_keras_file_arrays(plain_directory / file, tmp_path / "work" / file)


def test_parameters_sharded_on_tensorflows_collectives_equal_the_plain_script(plain, tmp_path):
    """... and as 3 processes on TensorFlow's collectives (no reduce-scatter on CPUs: the
    backward pass all-reduces each parameter's gradient and keeps its range), oneDNN off."""
    ranks = sharded_run(tmp_path, 3, FAST_CASES, ["--backend", "collective"],
                        extra_env=onednn("0"), strategy="parameters")
    assert_like_plain(plain(FAST_CASES)[0], ranks, per_variable=True)


def test_three_processes_on_tensorflows_collectives_equal_the_plain_script(plain, tmp_path):
    """... and the files ModelCheckpoint, model.save and save_weights wrote on every rank hold
    the plain script's arrays, the optimizer's whole state among them."""
    ranks = sharded_run(tmp_path, 3, FAST_CASES, ["--backend", "collective"],
                        extra_env=onednn("0"))
    reference, plain_directory = plain(FAST_CASES)
    assert_like_plain(reference, ranks)
    for file in ("best.keras", "model.keras", "model.weights.h5"):
        assert_same_keras_file_arrays(plain_directory / file, tmp_path / "work" / file)


def test_two_processes_on_the_mpi_engine_equal_the_plain_script(plain, tmp_path):
    """Plain tfdist-run's default engine (Open MPI's, `tfdist.comm.mpi`), which "auto" takes
    there (also make test's check of that choice): the gradients reduce-scattered with
    MPI_Reduce_scatter_block, the parameters all-gathered with MPI_Allgatherv; the same
    arrays and files as the plain script."""
    def plain_tfdist_run(world, args, **options):
        done = tfdist_run(world, args, **options)
        assert "on mpi (backend 'auto'" in done.stdout + done.stderr, failure_report(done)
        return done

    ranks = sharded_run(tmp_path, 2, FAST_CASES, [], launcher=plain_tfdist_run,
                        extra_env=onednn("1"))
    reference, plain_directory = plain(FAST_CASES)
    assert_like_plain(reference, ranks)
    for file in ("best.keras", "model.keras", "model.weights.h5"):
        assert_same_keras_file_arrays(plain_directory / file, tmp_path / "work" / file)


def test_a_save_on_rank_zero_alone_fails_at_once_naming_the_convention(tmp_path):
    """Horovod's convention (`if rank == 0: model.save(...)`) cannot save a sharded state:
    the chief fails as soon as the others are gone, saying what to do, instead of waiting
    out the job timeout (under plain tfdist-run: the MPI engine where Open MPI is installed,
    whose collective cannot fail: the chief's liveness watch ends it, naming the wait)."""
    done = tfdist_run(2, [script("sharded_optimizer.py"), str(tmp_path / "out"),
                          "--workdir", str(tmp_path), "--save-on-rank-zero-only"],
                      timeout=240, run_timeout=200)
    assert done.returncode != 0
    if "aggregator ring on mpi" in done.stdout:
        assert ("peer rank 1" in done.stdout and "is gone" in done.stdout
                and "every rank must save" in done.stdout), done.stdout[-3000:]
        assert "waited more than the 200 s timeout" not in done.stdout, done.stdout[-3000:]
    else:
        assert "this save needs every rank's slices of the optimizer state" in done.stdout, \
            done.stdout[-3000:]
        assert "Every rank must call the save" in done.stdout
    assert not (tmp_path / "rank_zero.keras").exists()


@pytest.mark.slow
def test_every_case_as_four_processes(plain, tmp_path):
    cases = every_case()
    assert_like_plain(plain(cases)[0], sharded_run(tmp_path, 4, cases,
                                                   ["--backend", "collective"],
                                                   extra_env=onednn("1")))


@pytest.mark.slow
@pytest.mark.horovod
def test_parameters_sharded_on_horovods_engine_equal_the_plain_script(plain, tmp_path):
    """sharding="parameters" under horovodrun ("auto": Horovod's engine, its reduce-scatter in
    the backward pass and its all-gather where a layer reads a parameter), every case."""
    cases = every_case()
    assert_like_plain(plain(cases)[0], sharded_run(tmp_path, 3, cases, ["--backend", "auto"],
                                                   launcher=horovodrun, strategy="parameters"),
                      per_variable=True)


@pytest.mark.slow
@pytest.mark.horovod
def test_horovods_engine_with_a_bucket_per_variable_equals_the_plain_script(plain, tmp_path):
    """Under horovodrun, "auto" takes Horovod's engine, which reduce-scatters the gradients;
    with a bucket per variable each rank owns nothing of some buckets (its part is padding)
    and still takes part in their collectives (Horovod's ops are stateless to TensorFlow: a
    result no rank reads was optimized away on that rank, and the others waited for it
    forever). Every case: the loss scale's finite check over the ranks, the custom loops,
    the checkpoints."""
    cases = every_case()
    assert_like_plain(plain(cases)[0], sharded_run(
        tmp_path, 3, cases, ["--backend", "auto", "--bucket-bytes", "256"],
        launcher=horovodrun))
