"""Process set-up: what each process does before TensorFlow starts.

- `cluster`: who am I, who are my peers - every launcher's environment
  (tfdist-run, horovodrun, mpirun, srun with `slurm_hostlist`, TF_CONFIG,
  Kubernetes Indexed Jobs), validated, with a message naming what is wrong;
- `gpu_placement`: one GPU per process from the launcher's local rank;
- `cpu_share`: processes on one host split the intra-op threads;
- `quiet_output` and `startup_notices`: one line per fact instead of
  TensorFlow's start-up notices, on every launcher;
- `child_processes`: children that die with their parent.

Every module here is TensorFlow-free (the launcher imports them) except
`gpu_placement` and `cpu_share`, which configure TensorFlow before its first op.
The package imports nothing itself: import the module you need.
"""
