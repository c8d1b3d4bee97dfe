"""`python -m tfdist.server`: a parameter-server process (see
`tfdist.aggregation.parameter_server.server_process`)."""

import sys

from tfdist.aggregation.parameter_server.server_process import main

if __name__ == "__main__":
    sys.exit(main())
