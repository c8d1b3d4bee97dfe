"""Fault tolerance: backups, the training state, preemption notices, agreed flags, restarts.

- `restarts`: the exit code of a planned stop and which restart this is
  (TensorFlow-free: the launcher reads them);
- `agreed_flags`: flags every rank agrees on at a step, carried by the
  step's one all-reduce (the preemption notice is one);
- `preemption`: a SIGTERM (or a polled check) becomes a flag, then a backup
  at the agreed step on every rank, then exit code 42;
- `training_state`: what a backup holds beyond the weights (epoch, steps,
  random and data positions, callbacks' state) and how a resume applies it;
- `backup_state`: one object that gathers, saves, restores and shares a
  backup (Horovod's `State`: save / restore / sync);
- `checkpoint_files`: files that are never torn (write, then rename).

The Keras side (which Keras methods call these, resume at the next batch)
is `tfdist.strategies.keras_patches.backup`. The package imports nothing
itself: import the module you need.
"""
