"""One training (or evaluation) step of several processes: what makes it equal one process's.

* `step_plan`: what kind of step a call is (`LOCAL`, `DEFERRED`,
  `IMMEDIATE`, `REMOTE`), decided once as it is traced;
* `replica_step`: the step in progress - its rows, its share of the global
  batch, the loss weights, the deferred optimizer updates;
* `synchronous_step`: a step of every rank together, ending in one fused
  all-reduce (`step_sum`) of the gradients (`global_gradients`), the row
  count, metric state and agreed flags;
* `cross_replica_sum`: the replica context's exact `all_reduce`;
* `empty_slice`, `row_accounting`, `average_loss`, `batch_dependence`:
  empty and uneven slices, loss denominators, `tf.nn.compute_average_loss`,
  and which values depend on the batch (so they are made global).
"""
