"""The strategy's core: `strategy.extended` and what the layers above may use of it.

* `extended`: `DataParallelExtended`, the implementation every tfdist
  strategy shares - the communicator and aggregator, variables, reductions,
  the dispatch of each step by its plan - calling the three modes
  (`tfdist.strategies.modes`) for whatever differs by mode;
* `extended_interface`: the members of `strategy.extended` the Keras
  patches, callbacks and profiling use (checked by a test);
* `job_summary`: the one start-up line of a job.
"""
