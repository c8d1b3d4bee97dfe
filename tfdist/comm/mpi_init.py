"""Open MPI through mpi4py, initialized once per process and within the job timeout.

mpi4py initializes MPI when `mpi4py.MPI` is first imported (`MPI_Init_thread`, thread
level "multiple"), and finalizes it at exit. Every tfdist module that uses MPI - the MPI
engine (`tfdist.comm.mpi`), the address exchange and the ranks' agreement under mpirun -
gets it from `initialized_mpi`, so that the start-up wait inside `MPI_Init` is bounded by
the job timeout (`tfdist.process_setup.startup_deadline`): there each rank connects to its
launcher's PMIx server (mpirun's, or slurmd's under `srun --mpi=pmix`) and waits for every
rank of the job. Cost: the import, once.
"""

import sys

from tfdist.process_setup import startup_deadline

# What can keep MPI_Init from returning, said when it times out.
MPI_INIT_CAUSES = (
    "each rank connects to its launcher's PMIx server (mpirun's), whose listener waits on "
    "any connection to its port that has not finished its handshake (a port scanner, a "
    "stranger's client holding a connection), and waits for every rank of the job to start")


def initialized_mpi(rank, timeout):
    """mpi4py's `MPI`, MPI initialized (within `timeout` seconds, else this process ends
    naming the wait), or an ImportError saying how to get mpi4py."""
    if "mpi4py.MPI" in sys.modules:
        return sys.modules["mpi4py.MPI"]
    try:
        import mpi4py  # pylint: disable=import-outside-toplevel
    except ImportError as e:
        raise ImportError(f"tfdist: MPI needs mpi4py and an MPI library ({e}): "
                          "pip install \"tfdist[mpi]\" with Open MPI installed, or `make "
                          "install` in a clone of tfdist") from e
    del mpi4py
    with startup_deadline.bounded("MPI_Init (Open MPI's start-up)", timeout, rank,
                                  MPI_INIT_CAUSES):
        from mpi4py import MPI  # pylint: disable=import-outside-toplevel
    return MPI
