#!/usr/bin/env bash
# Provide an MPI for `mpirun` jobs and Horovod's MPI controller: Debian's Open MPI.
#
#   scripts/install_mpi.sh
#
# Nothing to do when `mpicxx` and `mpirun` are already on the PATH (any MPI the user installed).
# Otherwise, as root on a machine with apt-get (as `.ci/run` runs), installs Debian's openmpi-bin
# and libopenmpi-dev. Anywhere else it stops with a message saying what to install: `make install`
# builds Horovod with MPI only when an MPI compiler is present, and mpi4py needs the library.
set -euo pipefail

if command -v mpicxx >/dev/null && command -v mpirun >/dev/null; then
    exit 0
fi
if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
    echo "install_mpi: installing Open MPI (Debian's openmpi-bin, libopenmpi-dev)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get -o DPkg::Lock::Timeout=600 update -qq
    apt-get -o DPkg::Lock::Timeout=600 install -y -qq openmpi-bin libopenmpi-dev >/dev/null
    command -v mpicxx >/dev/null || { echo "install_mpi: mpicxx still missing after apt-get" >&2; exit 1; }
    exit 0
fi
cat >&2 <<'MSG'
install_mpi: no MPI found (mpicxx, mpirun). tfdist's mpirun launcher, mpi4py and Horovod's MPI
controller need one. Install Open MPI and run `make install` again, e.g.
    sudo apt-get install openmpi-bin libopenmpi-dev      (Debian, Ubuntu)
    sudo dnf install openmpi-devel && module load mpi     (Fedora, RHEL)
    brew install open-mpi                                 (macOS)
or, to build without MPI (no mpirun jobs, Horovod on Gloo only): make install TFDIST_WITHOUT_MPI=1
MSG
exit 1
