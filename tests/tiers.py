"""Which cases of the case scripts each test tier runs.

The in-process Keras tier (test_keras_in_process.py, `make test-fast`)
runs the cases that take seconds as simulated ranks (and the inputs the
ranks must refuse alike, failure_modes.refusals); the multi-process suites
(test_real_world.py, test_keras_patterns.py) run on the real engines the
cases simulated ranks cannot run and the conventions that run in both;
`make test-all` runs every case in both tiers. So that `make test` stays
within its 20 minutes, the real-world cases that take longer than a few
seconds as simulated ranks (`REAL_WORLD_TEST_ALL_ONLY`) run in `make
test-all` only, and `make test` keeps one launch per launcher (but Ray's: a minute, most of
it Ray's own start; test_resume's Ray Train restart is in make test-all), strategy and
failure kind (the other kill-matrix victims, the second parameter-server
layout, Horovod's small buckets, ... are `slow`). Launches that differed
only in a flag share one where the world size is the same: the small
gradient buckets of test_buckets.py run in test_equivalence's 3 processes
(TF collectives) and test_tree's 3 (the tree); `backend="auto"` under
horovodrun is the Horovod job of 2 processes. `tfdist.horovod.keras` (test_horovod_api.py):
one mpirun job of 2 processes in make test (its Horovod-semantics exactness, collectives
and Horovod's ported Keras tests on Horovod/MPI; it is also make test's mpirun job, so
test_launchers' own mpirun + Horovod case is in make test-all); tfdist-run (TF
collectives), horovodrun (Horovod's engine, 3 processes), srun and the refusal of per-rank
data of different lengths in make test-all. Elastic training (test_elastic.py): one job
killed, shrunk and grown in make test, on unseeded tf.data with the backup on the chief
only, which makes test_resume's SIGTERM 3 -> 2 case (the same notice path and resume at
another size) a make test-all case; the decisions in-process (test_elastic_membership.py) and
the launcher's loop with probe ranks (test_launcher.py, seconds); Horovod's elastic API, Ray
Train's elastic ScalingConfig and a Slurm job requeued at another size in make test-all.
The custom steps that read their gradients or losses (keras_patterns' retyped Keras step and
clipping by hand, `test_keras_patterns.test_custom_steps_see_one_process_gradients_and_losses`):
in-process on the ring and the tree, on Open MPI's engine under plain tfdist-run in make test,
on TensorFlow's collectives, Horovod's engine and the synchronous parameter server in make
test-all. Optimizer-state sharding: four cases in-process at 2-4 ranks, the resume and the refusals
(test_sharded_optimizer_in_process.py) and the other three (loss scaling with EMA and
accumulation, the custom loop, the saved files) as 3 processes on TensorFlow's collectives
in make test; every case in-process, as 4 processes and on Horovod's engine (3 processes,
reduce-scattered gradients) in make test-all, where alone run_eagerly's masked GRU and the
sparse input run (their paths run unsharded in make test). To
keep make test within its time: the cluster's exposure (test_cluster_exposure.py) is poked on
the default engine and TensorFlow's collectives in make test, on Horovod's and the parameter
servers' (and held open) in make test-all; across emulated hosts (test_multi_host.py) make
test runs mpirun -H with the saves and the resume, make test-all TF_CONFIG, horovodrun -H,
srun on a two-node emulated Slurm, tfdist-run -H 2x2, a killed remote rank and a cut link; Horovod's examples (test_horovod_examples.py)
under tfdist-run in make test, horovodrun and mpirun in make test-all. Ray Train's restart, the async PS's Downpour accounting
launch, a worker SIGKILLed by the kill matrix (test_elastic's is), and the in-process runs
of cases make test runs as processes (multi_io_weights, saves_on_rank_zero) are make
test-all's.
"""

# real_world.py cases the in-process tier runs in make test-fast (a few seconds each).
REAL_WORLD_IN_PROCESS = (
    "guide_custom_loop", "multi_worker_custom_loop", "sync_batchnorm", "layer_state_aggregations",
    "evaluate_then_load_weights", "custom_loop_checkpoint", "ner_custom_loss", "added_losses",
    "fit_per_rank_pipeline", "slices_that_retrace_on_some_ranks", "eager_embedding",
    "hand_written_ratio", "saves_on_rank_zero", "schedule_free", "sparse_inputs")
# ... of which these run as processes in make test too: saving on rank 0 only (Horovod's
# convention) on real engines and file systems, and real_world_conventions.py's other cases.
REAL_WORLD_IN_BOTH = ("saves_on_rank_zero", "eager_embedding", "sparse_inputs",
                      "hand_written_ratio", "schedule_free")
# real_world_conventions.py cases the in-process tier also runs on the other aggregator at
# another size in make test-all (each class on ring and tree, at 2 and 3 ranks); make test
# runs them as processes (test_real_world.py's 2-process ring launch; in-process: make
# test-all, REAL_WORLD_IN_PROCESS_TEST_ALL_ONLY).
REAL_WORLD_CONVENTIONS = ("eager_embedding", "hand_written_ratio", "schedule_free",
                          "sparse_inputs")
# real_world.py cases simulated ranks cannot run as processes do: they draw from TensorFlow's
# process-wide random state, or compare with a reference computed in P slices.
REAL_WORLD_PROCESSES_ONLY = ("seeded_before_strategy", "reshuffled_dataset",
                             "mixed_float16_regression")
# keras_patterns.py cases simulated ranks cannot run: Python's `random` shuffles a PyDataset
# between threads; per-rank BatchNorm statistics only agree across ranks.
KERAS_PATTERNS_PROCESSES_ONLY = ("pydataset", "pydataset_unseeded", "batchnorm_empty_slices")
# real_world.py cases of REAL_WORLD_IN_BOTH the in-process tier runs in make test-all only:
# make test runs them as processes (saving on rank 0 only: 18 s as 5 simulated ranks; the
# four conventions, 42 s here, in test_real_world.py's 2-process launch).
REAL_WORLD_IN_PROCESS_TEST_ALL_ONLY = ("saves_on_rank_zero", "eager_embedding", "sparse_inputs",
                                       "hand_written_ratio", "schedule_free")
# keras_patterns.py cases the in-process tier runs in make test-all only: make test's
# parameter-server launch (test_keras_patterns.py) runs them as 2 processes (sample and class
# weights on three outputs: 19 s as 4 simulated ranks).
KERAS_PATTERNS_IN_PROCESS_TEST_ALL_ONLY = ("multi_io_weights",)
# real_world.py cases neither tier runs in make test (seconds-long as simulated ranks): make
# test-all runs them in-process and as 2, 3 and 4 processes.
REAL_WORLD_TEST_ALL_ONLY = ("layers_on_empty_slices", "save_then_load", "sequence_tagger",
                            "transformer_classifier", "loss_reductions", "multi_input_predict",
                            "metric_dtypes", "checkpoint_reload", "transfer_learning")
