#!/usr/bin/env bash
# make test-compat: the in-process tier and one 2-process equivalence on each Keras of
# constraints-compat.txt, each in its own venv (.venv-compat/<pin>), with TensorFlow and the
# other packages at constraints.txt's versions. keras-nightly installs the `keras` package
# under another name, so it replaces the released Keras pip resolved for tfdist.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
PYTEST_ARGS=${PYTEST_ARGS:-}
TEST_WORKERS=${TEST_WORKERS:-2}
pins=$(grep -E '^keras(-nightly)?==' constraints-compat.txt)
others=$(mktemp)
trap 'rm -f "$others"' EXIT
grep -vE '^keras(-nightly)?==' constraints.txt > "$others"
for pin in $pins; do
    venv=".venv-compat/${pin//==/-}"
    # A venv built before the test extra gained a package is built again.
    if [ ! -f "$venv/.installed" ] || ! "$venv/bin/python" -c "import xdist" 2>/dev/null; then
        echo "test-compat: building $venv"
        rm -rf "$venv"
        "$PYTHON" -m venv "$venv"
        "$venv/bin/python" -m pip install --quiet --upgrade pip
        "$venv/bin/python" -m pip install --quiet -c "$others" -e ".[cpu,profile,test,examples]"
        if [[ $pin == keras-nightly* ]]; then
            "$venv/bin/python" -m pip uninstall --quiet --yes keras
            "$venv/bin/python" -m pip install --quiet --no-deps "$pin"
        else
            "$venv/bin/python" -m pip install --quiet -c "$others" "$pin"
        fi
        touch "$venv/.installed"
    fi
    version=$("$venv/bin/python" -c "import keras; print(keras.__version__)" 2>/dev/null)
    echo "test-compat: Keras $version ($venv)"
    "$venv/bin/python" -m pytest -x -n "$TEST_WORKERS" --dist loadfile -m "in_process and not slow" \
        $PYTEST_ARGS tests
    "$venv/bin/python" -m pytest -x $PYTEST_ARGS \
        "tests/test_equivalence.py::test_same_training_as_one_process[2]" \
        "tests/test_equivalence.py::test_all_ranks_agree[2]"
done
