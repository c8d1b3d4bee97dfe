#!/usr/bin/env bash
# make test-compat: the in-process tier and one 2-process equivalence on each combination of
# constraints-compat.txt (a line of pins: a Keras, and a TensorFlow where the line names one),
# each in its own venv (.venv-compat/<pins>), with the other packages at constraints.txt's
# versions. keras-nightly installs the `keras` package under another name, so it replaces the
# released Keras pip resolved for tfdist; TensorFlow 2.22 depends on keras-nightly itself.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
PYTEST_ARGS=${PYTEST_ARGS:-}
TEST_WORKERS=${TEST_WORKERS:-2}
COMPAT_ONLY=${COMPAT_ONLY:-}  # a pattern: only the combinations whose line matches it
others=$(mktemp)
trap 'rm -f "$others"' EXIT
grep -vE '^#' constraints-compat.txt | grep -E -- "${COMPAT_ONLY:-.}" | while read -r line; do
    [ -n "$line" ] || continue
    pins=($line)
    # constraints.txt less the packages this combination pins
    names=$(printf '%s\n' "${pins[@]}" | sed -E 's/[=<>!~].*//' | sed -E 's/^keras-nightly$/keras/')
    pattern="^($(echo $names | tr ' ' '|'))(-nightly)?=="
    grep -vE "$pattern" constraints.txt > "$others"
    venv=".venv-compat/$(echo "${pins[@]}" | sed -E 's/==/-/g; s/ /+/g')"
    # A venv built before the test extra gained a package is built again.
    if [ ! -f "$venv/.installed" ] || ! "$venv/bin/python" -c "import xdist" 2>/dev/null; then
        echo "test-compat: building $venv"
        rm -rf "$venv"
        "$PYTHON" -m venv "$venv"
        "$venv/bin/python" -m pip install --quiet --upgrade pip
        tensorflow=$(printf '%s\n' "${pins[@]}" | grep -E '^tensorflow' || true)
        # tfdist with its extras (mpi4py: the MPI engine built and run on these versions
        # too), TensorFlow as pinned (a release candidate included)
        extras=cpu,profile,test,examples
        [ -n "${TFDIST_WITHOUT_MPI:-}" ] || extras=$extras,mpi
        "$venv/bin/python" -m pip install --quiet -c "$others" ${tensorflow:+"$tensorflow"} \
            -e ".[$extras]"
        for pin in "${pins[@]}"; do
            case $pin in
                keras-nightly*)
                    "$venv/bin/python" -m pip uninstall --quiet --yes keras 2>/dev/null || true
                    "$venv/bin/python" -m pip install --quiet --no-deps --force-reinstall "$pin" ;;
                keras==*)
                    "$venv/bin/python" -m pip install --quiet -c "$others" "$pin" ;;
            esac
        done
        touch "$venv/.installed"
    fi
    versions=$("$venv/bin/python" -c "import tensorflow as tf, keras; print(f'TensorFlow {tf.__version__}, Keras {keras.__version__}')" 2>/dev/null)
    echo "test-compat: $versions ($venv)"
    "$venv/bin/python" -m pytest -x -n "$TEST_WORKERS" --dist loadfile -m "in_process and not slow" \
        $PYTEST_ARGS tests </dev/null
    "$venv/bin/python" -m pytest -x $PYTEST_ARGS \
        "tests/test_equivalence.py::test_same_training_as_one_process[2]" \
        "tests/test_equivalence.py::test_all_ranks_agree[2]" </dev/null
done
