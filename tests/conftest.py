"""Fixtures shared by the tests; the helpers they use are in `helpers.py`."""

import pytest

from helpers import tfdist_run, train_equivalence


@pytest.fixture
def workdir(tmp_path):
    return tmp_path


@pytest.fixture(scope="session")
def one_process_run(tmp_path_factory):
    """`get(*options)`: tests/scripts/train_equivalence.py on one process, run once per options.

    One process trains the same way whatever the strategy (there is nothing
    to aggregate), so every equivalence test compares against the same run:
    the strategy and bucket options are dropped from the cache key and from
    the launch.
    """
    cache = {}

    def get(*options):
        options = _without_strategy(options)
        if options not in cache:
            prefix = str(tmp_path_factory.mktemp("one_process") / "np1")
            cache[options] = train_equivalence(tfdist_run, 1, prefix, *options)[0]
        return cache[options]

    return get


AGGREGATION_OPTIONS = ("--strategy", "--bucket-bytes", "--first-bucket-bytes")


def _without_strategy(options):
    """The options without those that only choose how gradients are aggregated."""
    options = list(options)
    for name in AGGREGATION_OPTIONS:
        if name in options:
            at = options.index(name)
            del options[at:at + 2]
    return tuple(options)


# Files whose tests start no process (but those marked `launches`): the in-process tier,
# `make test-fast` (pytest -m in_process), which `make test` runs first.
IN_PROCESS_FILES = {
    "test_aggregators_in_process.py", "test_async_store_in_process.py",
    "test_batch_dependence_in_process.py",
    "test_checkpoints_in_process.py", "test_cluster.py", "test_gpu_placement.py",
    "test_horovod_api_units.py",
    "test_iterator_release.py",
    "test_keras_in_process.py", "test_simulation_in_process.py",
    "test_cost_model_units.py", "test_cpu_share.py", "test_elastic_membership.py",
    "test_engine_choice.py",
    "test_env_vars.py", "test_lars.py", "test_lr_callbacks.py",
    "test_profiling_in_process.py", "test_quiet_output.py", "test_recommend.py",
    "test_resume_in_process.py", "test_saving_in_process.py",
    "test_sharded_optimizer_in_process.py",
    "test_step_in_process.py", "test_structure.py", "test_mpi_engine.py", "test_units.py",
    "test_versions.py",
}


def pytest_collection_modifyitems(config, items):
    del config
    for item in items:
        if (item.path.name in IN_PROCESS_FILES
                and item.get_closest_marker("launches") is None):
            item.add_marker(pytest.mark.in_process)


def pytest_addoption(parser):
    parser.addoption("--time-budgets", action="store_true",
                     help="report each test file's time against its budget, and name those "
                          "over it (tests/time_budget.py; never fails the run)")


def pytest_configure(config):
    from time_budget import TimeBudgets  # pylint: disable=import-outside-toplevel
    from tfdist.comm.simulated import reserve_inter_op_threads  # pylint: disable=import-outside-toplevel

    # Before any test runs a TensorFlow op: simulated ranks' compiled steps wait for their
    # peers on TensorFlow's inter-op threads (test_keras_in_process.py).
    reserve_inter_op_threads()

    config.pluginmanager.register(TimeBudgets(config.getoption("--time-budgets")),
                                  "tfdist_time_budgets")
