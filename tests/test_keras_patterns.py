"""Real-world Keras code trains exactly like one process.

tests/scripts/keras_patterns.py runs keras.io-style cases - text models with
Adam/RMSprop (sparse gradients), multi-input/multi-output models with sample
and class weights, uneven and empty slices, clipping, mixed precision,
gradient accumulation, custom train_step/test_step, a rank-local stop,
predict/evaluate/*_on_batch sequences, PyDataset and generators - in one
launch per configuration. Every configuration must reproduce the
single-process weights, history, evaluation and predictions (the shared
reference run), and all ranks of a run must agree exactly.
"""

import re
import subprocess
import sys

import pytest

from helpers import (assert_ranks_match_reference, horovodrun, load_ranks, onednn,
                     run_case_script, script, tfdist_run)
from tiers import KERAS_PATTERNS_PROCESSES_ONLY

# Float summation order differs between 1 and N processes; losses of the
# clipping case are in the thousands, hence the relative term.
RTOL, ATOL = 1e-5, 1e-4
# float16 rounds a gradient summed over slices differently from one over the whole batch
# (2^-11 per rounding); how much depends on the CPU's float16 kernels (docs/guarantees.md, "Mixed
# precision"; tests/test_real_world.py compares with one process computing P slices exactly).
FLOAT16_CASES, FLOAT16_RTOL, FLOAT16_ATOL = ("mixed_precision",), 2e-3, 1e-3
# Cases that cannot match one process by construction: per-rank BatchNorm
# batch statistics (docs/guarantees.md), and an unseeded run (its own random draws).
RANK_AGREEMENT_ONLY = ("batchnorm_empty_slices", "pydataset_unseeded")
SUBSET = "text_adam,multi_io_weights,clipping,mixed_precision,custom_low_level,predict_sequences"
# make test's parameter-server launch: sparse gradients and sample/class weights (the rest of
# SUBSET runs in-process on the ring and the tree, and on the PS in make test-all).
PS_SUBSET = "text_adam,multi_io_weights"


def pattern_names():
    """The cases tests/scripts/keras_patterns.py defines (`case_<name>` functions)."""
    with open(script("keras_patterns.py"), encoding="utf-8") as source:
        return re.findall(r"^def case_(\w+)\(", source.read(), flags=re.MULTILINE)


@pytest.fixture(scope="module")
def references(tmp_path_factory):
    """The single-process runs configurations are compared with: `references(cases)` runs the
    script once per list of cases (None: every case) and keeps it for the module."""
    runs = {}

    def reference(cases=None):
        if cases not in runs:
            prefix = str(tmp_path_factory.mktemp("patterns") / "np1")
            done = subprocess.run([sys.executable, script("keras_patterns.py"), prefix]
                                  + (["--cases", cases] if cases else []),
                                  capture_output=True, text=True, timeout=900)
            assert done.returncode == 0, done.stderr[-3000:]
            runs[cases] = load_ranks(prefix, 1)[0]
        return runs[cases]

    return reference


@pytest.fixture(scope="module")
def reference(references):
    """The single-process run of every case (make test-all's configurations)."""
    return references()


def run(tmp_path, world, strategy_args, cases=None, launcher=None, extra_env=None):
    return run_case_script("keras_patterns.py", str(tmp_path / f"np{world}"), world,
                           strategy_args, cases, launcher, extra_env)


def tolerance(key):
    return (FLOAT16_RTOL, FLOAT16_ATOL) if key.startswith(FLOAT16_CASES) else (RTOL, ATOL)


def assert_matches_one_process(reference, ranks):
    return assert_ranks_match_reference(reference, ranks, tolerance, "one process",
                                        skip=RANK_AGREEMENT_ONLY)


@pytest.mark.slow  # make test: the in-process tier checks every pattern against one rank
def test_reference_trains_and_covers_every_pattern(reference):
    cases = {key.split("/")[0] for key in reference}
    assert cases == set(pattern_names()), sorted(set(pattern_names()) ^ cases)
    assert reference["rank_local_epoch_stop/epochs_run"] == 2
    assert reference["text_adam/h_loss"][-1] < reference["text_adam/h_loss"][0]
    # The custom train_step patterns log the real loss (not a 1/N fraction of it).
    assert reference["custom_low_level/h_loss"][0] > 0.5
    # The rank-local stop ends training at batch 7 (3 batches per epoch: epoch 3).
    assert reference["custom_low_level/epochs_run"] == 3
    assert reference["predict_sequences/p_on_batch"].shape == (5, 1)


@pytest.mark.slow  # make test: every case but three runs in-process (test_keras_in_process)
def test_ring_collective_three_processes(reference, tmp_path):
    """101 rows in batches of 32 split 10/11/11; several cases have empty slices."""
    ranks = run(tmp_path, 3, ["--strategy", "ring", "--backend", "collective"])
    assert_matches_one_process(reference, ranks)
    assert ranks[0]["custom_low_level/epochs_run"] == 3


def test_parameter_server_two_processes_without_onednn(references, tmp_path):
    """Sparse gradients and weights, and the cases only processes can run (`tiers.py`:
    PyDataset shuffles with Python's `random`, per-rank BatchNorm statistics), with
    TensorFlow's oneDNN kernels forced off (`helpers.onednn`; real_world's ring forces them
    on)."""
    cases = PS_SUBSET.split(",") + list(KERAS_PATTERNS_PROCESSES_ONLY)
    ranks = run(tmp_path, 2, ["--strategy", "ps"], cases=",".join(cases), extra_env=onednn("0"))
    reference = references(",".join(cases))  # these cases only: a third of the whole script
    assert len(assert_matches_one_process(reference, ranks)) == len(cases)


CUSTOM_STEPS = "retyped_keras_step,clipped_by_hand,custom_loop_clipped_by_hand,custom_low_level"


@pytest.mark.parametrize("backend,kernels", [
    ("auto", "1"),  # plain tfdist-run: Open MPI's engine
    pytest.param("collective", "0", marks=pytest.mark.slow),  # make test-all
    pytest.param("horovod", "1", marks=[pytest.mark.slow, pytest.mark.horovod]),
    pytest.param("ps", "1", marks=pytest.mark.slow),  # the synchronous parameter server
])
def test_custom_steps_see_one_process_gradients_and_losses(references, tmp_path, backend,
                                                          kernels):
    """Keras' own step retyped (its loss tracker given what scale_loss returned), gradients
    clipped by their global norm in a train_step and in a custom loop: one process's numbers
    on each engine (the logged loss and norm included)."""
    launcher = None if backend != "horovod" else (lambda world, args, **kw: tfdist_run(
        world, args, launcher=["--no-mpi"], **kw))
    strategy = ["--strategy", "ps"] if backend == "ps" else ["--backend", backend]
    ranks = run(tmp_path, 2, strategy, cases=CUSTOM_STEPS, launcher=launcher,
                extra_env=onednn(kernels))
    assert len(assert_matches_one_process(references(CUSTOM_STEPS), ranks)) == 4


@pytest.mark.slow
def test_ring_collective_two_processes(reference, tmp_path):
    assert_matches_one_process(reference, run(tmp_path, 2, ["--backend", "collective"]))


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 3])
def test_reduction_tree(reference, tmp_path, world):
    assert_matches_one_process(reference, run(tmp_path, world, ["--strategy", "tree"]))


@pytest.mark.slow
def test_parameter_server_three_workers_two_servers(reference, tmp_path):
    ranks = run(tmp_path, 3, ["--strategy", "ps"], launcher=lambda world, args, **kw: tfdist_run(
        world, args, launcher=["--num-servers", "2"], **kw))
    assert_matches_one_process(reference, ranks)


@pytest.mark.slow
@pytest.mark.horovod
@pytest.mark.parametrize("world", [2, 3])
def test_horovod(reference, tmp_path, world):
    assert_matches_one_process(reference, run(tmp_path, world, ["--backend", "horovod"],
                                              launcher=horovodrun))
