"""Which cases of the case scripts each test tier runs, so that every case runs in `make test`.

The in-process Keras tier (test_keras_in_process.py, `make test-fast`)
runs the cases that take seconds as simulated ranks; the multi-process
suites (test_real_world.py, test_keras_patterns.py) run the rest on the
real engines, and everything again in `make test-all`.
"""

# real_world.py cases the in-process tier runs in make test-fast (a few seconds each).
REAL_WORLD_IN_PROCESS = (
    "guide_custom_loop", "multi_worker_custom_loop", "sync_batchnorm", "layer_state_aggregations",
    "evaluate_then_load_weights", "custom_loop_checkpoint", "ner_custom_loss", "added_losses",
    "fit_per_rank_pipeline", "slices_that_retrace_on_some_ranks")
# real_world.py cases simulated ranks cannot run as processes do: they draw from TensorFlow's
# process-wide random state, or compare with a reference computed in P slices.
REAL_WORLD_PROCESSES_ONLY = ("seeded_before_strategy", "reshuffled_dataset",
                             "mixed_float16_regression")
# keras_patterns.py cases simulated ranks cannot run: Python's `random` shuffles a PyDataset
# between threads; per-rank BatchNorm statistics only agree across ranks.
KERAS_PATTERNS_PROCESSES_ONLY = ("pydataset", "pydataset_unseeded", "batchnorm_empty_slices")
