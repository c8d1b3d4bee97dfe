#!/usr/bin/env bash
# Build (once per machine) and install Horovod 0.28.1 against the TensorFlow in a venv.
#
#   scripts/install_horovod.sh VENV_PYTHON
#
# Horovod 0.28.1 (the latest release) does not compile against TensorFlow >= 2.16 as shipped:
# horovod/tensorflow/xla_mpi_ops.cc includes XLA headers that moved. That file only provides
# Horovod ops inside XLA-compiled functions (tfdist keeps collectives out of XLA), so its body is
# compiled out, and the extension is built with Gloo (and MPI when an MPI compiler is on PATH).
# With a CUDA toolkit (nvcc on PATH or in $CUDA_HOME/bin) and NCCL (nccl.h under $NCCL_HOME,
# $CUDA_HOME or /usr) the build adds GPU operations on NCCL (HOROVOD_GPU_OPERATIONS=NCCL);
# otherwise it is CPU-only. The script says which. The wheel is cached per (Horovod, TensorFlow, Python)
# version and controllers (Gloo, or Gloo + MPI) in $TFDIST_WHEEL_CACHE (default ~/.cache/tfdist/wheels): later installs take seconds.
# Needs cmake >= 3.13 and g++. Any failure stops the install (set -e): nothing is skipped.
set -euo pipefail

python=${1:?usage: $0 VENV_PYTHON}
version=0.28.1

# With an MPI compiler on the PATH the build must include MPI (a Gloo-only Horovod built before
# Open MPI was installed is rebuilt).
# TFDIST_WITHOUT_MPI=1 (make install TFDIST_WITHOUT_MPI=1): Gloo only, whatever is installed.
if [[ ${TFDIST_WITHOUT_MPI:-} != 1 ]] && command -v mpicxx >/dev/null; then
    with_mpi=1
    # The wheel links this MPI: its version is part of the cache key.
    controllers=gloo-mpi-$( (mpicxx --showme:version 2>/dev/null || mpicxx -v 2>&1) | cksum | cut -d' ' -f1)
else
    with_mpi=0; controllers=gloo
fi
# CUDA and NCCL: GPU operations on NCCL, else CPU-only.
cuda_home=${CUDA_HOME:-}
nvcc=$(command -v nvcc || true)
[[ -z $nvcc && -n $cuda_home && -x $cuda_home/bin/nvcc ]] && nvcc=$cuda_home/bin/nvcc
nccl_home=
for dir in ${NCCL_HOME:-} ${cuda_home:-} /usr /usr/local; do
    [[ -n $dir && -f $dir/include/nccl.h ]] && { nccl_home=$dir; break; }
done
if [[ -n $nvcc && -n $nccl_home ]]; then
    with_gpu=1
    cuda_home=${cuda_home:-$(dirname "$(dirname "$nvcc")")}
    cuda_version=$("$nvcc" --version | sed -n 's/.*release \([0-9.]*\).*/\1/p')
    controllers=$controllers-cuda$cuda_version-nccl
    echo "install_horovod: CUDA $cuda_version ($cuda_home) and NCCL ($nccl_home): GPU operations on NCCL"
else
    with_gpu=0
    echo "install_horovod: CPU-only (no CUDA toolkit with NCCL: nvcc ${nvcc:-not found}, nccl.h ${nccl_home:-not found})"
fi
if "$python" -c "import horovod, horovod.tensorflow as hvd; assert horovod.__version__ == '$version'
assert hvd.mpi_built() == bool($with_mpi)
assert hvd.nccl_built() == bool($with_gpu)" 2>/dev/null; then
    exit 0
fi

for tool in cmake g++; do
    command -v "$tool" >/dev/null || { echo "install_horovod: '$tool' is required to build Horovod" >&2; exit 1; }
done

tf_version=$("$python" -c "import tensorflow as tf; print(tf.__version__)")
py_tag=$("$python" -c "import sys; print(f'cp{sys.version_info[0]}{sys.version_info[1]}')")
cache=${TFDIST_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/tfdist/wheels}/horovod-$version-tf$tf_version-$py_tag-$(uname -m)-$controllers
wheel=$(ls "$cache"/horovod-$version-*.whl 2>/dev/null | head -n 1 || true)

if [[ -z $wheel ]]; then
    echo "install_horovod: building Horovod $version for TensorFlow $tf_version (a few minutes)"
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
    "$python" -m pip download --quiet --no-deps --no-binary :all: "horovod==$version" -d "$work"
    tar -xzf "$work/horovod-$version.tar.gz" -C "$work"
    src=$work/horovod-$version
    xla=$src/horovod/tensorflow/xla_mpi_ops.cc
    sed -i '0,/^#if TENSORFLOW_VERSION >= 2006000000$/s//#if TENSORFLOW_VERSION >= 2006000000 \&\& TFDIST_HOROVOD_XLA_OPS/' "$xla"
    grep -q '^#if TENSORFLOW_VERSION >= 2006000000 && TFDIST_HOROVOD_XLA_OPS$' "$xla" \
        || { echo "install_horovod: the compatibility patch did not apply to $xla" >&2; exit 1; }

    if [[ $with_mpi == 1 ]]; then mpi=HOROVOD_WITH_MPI=1; else mpi=HOROVOD_WITHOUT_MPI=1; fi
    gpu=()
    if [[ $with_gpu == 1 ]]; then
        gpu=(HOROVOD_GPU_OPERATIONS=NCCL "HOROVOD_CUDA_HOME=$cuda_home" "HOROVOD_NCCL_HOME=$nccl_home")
    fi
    # Build dependencies come from the venv (TensorFlow must be the installed one: no isolation).
    "$python" -m pip install --quiet cloudpickle psutil pyyaml packaging
    env HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_GLOO=1 "$mpi" "${gpu[@]}" HOROVOD_WITHOUT_PYTORCH=1 \
        HOROVOD_WITHOUT_MXNET=1 MAKEFLAGS="-j$(nproc)" \
        "$python" -m pip wheel --no-build-isolation --no-deps -w "$work/dist" "$src"
    mkdir -p "$cache"
    cp "$work"/dist/horovod-$version-*.whl "$cache"/
    wheel=$(ls "$cache"/horovod-$version-*.whl | head -n 1)
fi

"$python" -m pip install --quiet "$wheel"   # with Horovod's dependencies (psutil, cloudpickle, ...)
# The same version built without MPI may be installed already: replace it with this build.
"$python" -m pip install --quiet --force-reinstall --no-deps "$wheel"
"$python" -c "import horovod.tensorflow as hvd; hvd.init(); assert hvd.gloo_built(), 'Horovod built without Gloo'
assert hvd.mpi_built() or not $with_mpi, 'Horovod built without MPI although mpicxx is present'
assert hvd.nccl_built() == bool($with_gpu), 'Horovod built with NCCL: %s, asked: %s' % (hvd.nccl_built(), bool($with_gpu))"
echo "install_horovod: Horovod $version installed ($wheel)"
