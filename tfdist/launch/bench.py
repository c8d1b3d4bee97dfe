"""`tfdist-bench`: run the benchmarks of a tfdist source checkout.

The benchmarks are not part of the installed package (they are experiments,
with their results committed beside them); they live in `benchmarks/` at
the top of the repository. This entry point finds that directory next to the
`tfdist` package of an editable or in-place install and runs
`benchmarks.cli`; anywhere else it says how to get it.
"""

import os
import sys

CHECKOUT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main(argv=None):
    if not os.path.isfile(os.path.join(CHECKOUT, "benchmarks", "cli.py")):
        print("tfdist-bench runs the benchmarks of a source checkout: clone the tfdist "
              "repository and install it with `pip install -e .` (or run `make bench`).",
              file=sys.stderr)
        return 2
    if CHECKOUT not in sys.path:
        sys.path.insert(0, CHECKOUT)
    from benchmarks.cli import main as benchmarks_main  # pylint: disable=import-outside-toplevel

    return benchmarks_main(argv)


if __name__ == "__main__":
    sys.exit(main())
