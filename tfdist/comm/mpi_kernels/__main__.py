import sys

from tfdist.comm.mpi_kernels import main

sys.exit(main())
