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
