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
  backup (Horovod's `State`: save / restore / sync), given what it needs of
  the job as a `BackupJob` (the ranks, a communicator, the state that is not
  the same on every rank), as Horovod's `State` is given its collectives;
- `checkpoint_files`: files that are never torn (write, then rename);
- `elastic_channel`: the files between `tfdist-run`'s elastic loop and its
  ranks (a resize request, the last backup's position);
- `membership`: how many processes an elastic job runs (the launcher's
  decisions; no processes, no clock).

This package sits below the strategies and imports nothing from them (nor
from the runtime, callbacks or launcher): the strategy's layer reaches it
through `BackupJob` (`tfdist.strategies.core.backup_job`), and the
Keras side (which Keras methods call these, resume at the next batch) is
`tfdist.strategies.keras_patches.backup`. The package imports nothing
itself: import the module you need.
"""
