"""State across ranks: what is the same on every rank, what is each rank's own, and the check.

* `local_state`: metric state and layer statistics made global after every
  step;
* `rank_state`: a rank's own state (compression residuals) saved beside the
  chief's checkpoint;
* `random_state`, `variable_broadcast`: random state and variables made
  alike from rank 0;
* `replica_consistency`: every rank's weights compared (`ReplicasDiverged`);
* `save_records`: the chief's completed saves, for ranks that wait for them.
"""
