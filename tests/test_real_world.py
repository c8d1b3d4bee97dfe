"""Scripts a new user brings train on N processes as the plain script trains on one.

tests/scripts/real_world.py holds keras.io- and TF-guide-style cases the
keras_patterns suite does not walk: the TensorFlow guide's custom training
loops (`strategy.run`, `distribute_datasets_from_function`, `tf.train.Checkpoint`),
a recurrent tagger with a masked per-token loss, keras.io's NER loss (its
own mean over the non-padding tokens), keras.io's Transformer
classifier (a position embedding), loss reductions by other denominators
than rows, shuffles seeded by `set_random_seed`, multi-input predict,
integer-state metrics, slices after which only some ranks trace a step
again, a checkpoint loaded right after `fit`, transfer
learning, added losses and `fit` on per-rank pipelines.

The reference is the *plain* script: no tfdist at all, the default
`tf.distribute` strategy (`--strategy plain`). Every configuration must
reproduce its weights, history, evaluation and predictions, and all ranks
must agree exactly. The one case that cannot match by construction,
`mixed_float16_regression` (float16 rounds a sum over P slices differently
and may overflow elsewhere: docs/guarantees.md), must equal the plain script computing
each step as P slices (`--slices P`) instead.
"""

import subprocess
import sys

import numpy as np
import pytest

from helpers import (assert_ranks_match_reference, horovodrun, load_ranks, onednn,
                     run_case_script, script, tfdist_run)
from tiers import REAL_WORLD_IN_BOTH, REAL_WORLD_IN_PROCESS, REAL_WORLD_PROCESSES_ONLY

RTOL, ATOL = 1e-5, 1e-4
ALL_CASES = ("seeded_before_strategy", "reshuffled_dataset", "guide_custom_loop",
             "multi_worker_custom_loop", "layers_on_empty_slices", "sync_batchnorm",
             "layer_state_aggregations", "save_then_load", "evaluate_then_load_weights",
             "custom_loop_checkpoint", "sequence_tagger", "ner_custom_loss",
             "transformer_classifier", "loss_reductions", "fit_per_rank_pipeline", "added_losses",
             "multi_input_predict", "slices_that_retrace_on_some_ranks", "metric_dtypes",
             "checkpoint_reload", "transfer_learning", "mixed_float16_regression",
             "eager_embedding", "sparse_inputs", "hand_written_ratio", "schedule_free",
             "saves_on_rank_zero")
# make test: the cases simulated ranks cannot run, and the conventions (in-process in make
# test-all);
# make test-all: every case as processes.
PROCESS_CASES = tuple(name for name in ALL_CASES
                      if name in REAL_WORLD_PROCESSES_ONLY or name in REAL_WORLD_IN_BOTH)
SLICED_REFERENCE = "mixed_float16_regression"  # compared with `--slices P`, not the plain run
# What differs between aggregators: static shapes, sparse and integer sums, custom loops.
FAST_SUBSET = ("guide_custom_loop,layers_on_empty_slices,sync_batchnorm,layer_state_aggregations,"
               "sequence_tagger,transformer_classifier,metric_dtypes,ner_custom_loss,"
               "slices_that_retrace_on_some_ranks")


def plain_run(prefix, *options):
    done = subprocess.run([sys.executable, script("real_world.py"), prefix, "--strategy", "plain",
                           *options], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return load_ranks(prefix, 1)[0]


@pytest.fixture(scope="module")
def references(tmp_path_factory):
    """`get(world, every_case=False)`: the plain run of the cases processes run in make test
    (`PROCESS_CASES`; every case with `every_case`), with the float16 case's sliced run for
    `world`; each run once."""
    directory = tmp_path_factory.mktemp("real_world")
    plain, sliced = {}, {}

    def get(world, every_case=False):
        if every_case not in plain:
            cases = ALL_CASES if every_case else PROCESS_CASES
            plain[every_case] = plain_run(str(directory / f"plain{len(cases)}"),
                                          "--cases", ",".join(cases))
        reference = dict(plain[every_case])
        if world > 1:
            if world not in sliced:
                sliced[world] = plain_run(str(directory / f"sliced{world}"), "--slices",
                                          str(world), "--cases", SLICED_REFERENCE)
            reference.update(sliced[world])
        return reference

    return get


def run(tmp_path, world, strategy_args, cases=None, launcher=None, extra_env=None):
    return run_case_script("real_world.py", str(tmp_path / f"np{world}"), world,
                           ["--workdir", str(tmp_path)] + strategy_args, cases, launcher,
                           extra_env)


def assert_matches_plain_script(reference, ranks):
    return assert_ranks_match_reference(reference, ranks, lambda key: (RTOL, ATOL),
                                        "the plain script")


def test_plain_reference_trains_the_cases_processes_run(references):
    reference = references(1)
    assert {key.split("/")[0] for key in reference} == set(PROCESS_CASES)
    history = reference["seeded_before_strategy/h_loss"]
    assert history[-1] < history[0]


@pytest.mark.slow
def test_plain_reference_trains_every_case(references):
    reference = references(1, every_case=True)
    cases = {key.split("/")[0] for key in reference}
    assert cases == set(ALL_CASES) and len(cases) == 27
    history = reference["guide_custom_loop/h_loss"]
    assert history[-1] < history[0]
    assert reference["sequence_tagger/h_loss"][-1] < reference["sequence_tagger/h_loss"][0]
    # Loaded right after fit: the best epoch's weights, which training then changes.
    assert not np.allclose(reference["checkpoint_reload/loaded_w0"],
                           reference["checkpoint_reload/w0"])
    assert reference["multi_worker_custom_loop/local_results"] == 1


def test_sliced_reference_differs_from_the_plain_script_in_float16(references):
    """The float16 noise floor is real: the sliced one-process run is not the plain one."""
    plain, sliced = references(1), references(2)
    key = f"{SLICED_REFERENCE}/w0"
    assert not np.allclose(plain[key], sliced[key], atol=1e-6)


def test_ring_collective_two_processes_with_onednn(references, tmp_path):
    """At 2 processes (193 rows in batches of 32: the last batch's one row leaves a rank an
    empty slice), the cases only processes can run and the conventions that also run
    in-process (`tiers.py`; saving on rank 0 only, Horovod's convention, among them; make
    test-all: all 27 at 2, 3 and 4), with oneDNN's kernels forced on (`helpers.onednn`): its
    max pool gradient aborts and its convolutions misshape on zero rows, which empty slices
    must never reach."""
    ranks = run(tmp_path, 2, ["--strategy", "ring", "--backend", "collective"],
                cases=",".join(PROCESS_CASES), extra_env=onednn("1"))
    assert len(assert_matches_plain_script(references(2), ranks)) == len(PROCESS_CASES)


@pytest.mark.slow  # make test: the in-process tier runs these cases on trees of 2-5 ranks
def test_reduction_tree_two_processes_with_onednn(references, tmp_path):
    """oneDNN's kernels forced on, the fast subset on the reduction tree's transfers."""
    ranks = run(tmp_path, 2, ["--strategy", "tree"], cases=FAST_SUBSET, extra_env=onednn("1"))
    assert_matches_plain_script(references(2, every_case=True), ranks)


@pytest.mark.slow  # make test: keras_patterns' parameter server, oneDNN forced off
def test_parameter_server_two_processes_without_onednn(references, tmp_path):
    ranks = run(tmp_path, 2, ["--strategy", "ps"], cases=FAST_SUBSET, extra_env=onednn("0"))
    assert_matches_plain_script(references(2, every_case=True), ranks)


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 3, 4])
def test_ring_collective(references, tmp_path, world):
    assert_matches_plain_script(references(world, every_case=True),
                                run(tmp_path, world, ["--backend", "collective"]))


@pytest.mark.slow
def test_reduction_tree_three_processes(references, tmp_path):
    assert_matches_plain_script(references(3, every_case=True),
                                run(tmp_path, 3, ["--strategy", "tree"]))


@pytest.mark.slow
def test_parameter_server_three_workers_two_servers(references, tmp_path):
    ranks = run(tmp_path, 3, ["--strategy", "ps"], launcher=lambda world, args, **kw: tfdist_run(
        world, args, launcher=["--num-servers", "2"], **kw))
    assert_matches_plain_script(references(3, every_case=True), ranks)


@pytest.mark.slow
@pytest.mark.horovod
@pytest.mark.parametrize("world", [2, 3])
def test_horovod(references, tmp_path, world):
    assert_matches_plain_script(references(world, every_case=True),
                                run(tmp_path, world, ["--backend", "horovod"],
                                    launcher=horovodrun))
