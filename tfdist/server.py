"""`python -m tfdist.server`: a parameter-server process (see
`tfdist.aggregation.parameter_server.server_process`).

The entry point decides how the process ends: with the server's exit code,
and without interpreter teardown when a reducer thread is still inside
TensorFlow (`ServerOutcome.teardown_safe`).
"""

import os
import sys

from tfdist.aggregation.parameter_server.server_process import main


def run():
    outcome = main()
    if not outcome.teardown_safe:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(outcome.code)  # pylint: disable=protected-access
    return outcome.code


if __name__ == "__main__":
    sys.exit(run())
