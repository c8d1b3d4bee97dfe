"""The data each rank iterates, and the checks that ranks were given the same.

* `batch_slicing`: rank r's slice of a global batch of any size (the
  global-batch input mode's; not to be confused with the optimizer-state
  sharding of `modes.sharded_state`);
* `local_input`, `iterator_release`: a rank's part as a plain `tf.data`
  dataset, its iterators released with the epoch;
* `call_arguments`, `data_fingerprint`, `same_data_check`: fit / evaluate /
  predict's arguments and in-memory arrays compared across ranks in one
  all-gather.
"""
