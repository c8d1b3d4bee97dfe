"""A dedicated parameter-server process: `python -m tfdist.server`.

Serves one shard of `ParameterServerStrategy` until every worker has
finished (exit code 0) or a worker fails (exit code 1, with a message naming
it). The process learns its index, address and the number of workers from
`tfdist-run --num-servers K` or from a `TF_CONFIG` `ps` task, like any tfdist
process. A training script started in a server role (which is what
`tfdist-run --num-servers K` and a TFJob's `ps` replicas do) enters the same
server when it creates its `ParameterServerStrategy`, and exits there: the
rest of the script runs only on workers.
"""

import sys

from absl import logging

from tfdist import runtime
from tfdist.errors import ClusterError


def run_server(cluster):
    """Serve shard `cluster.server_index`; return the process exit code."""
    from tfdist.aggregation.shard_server import ShardServer

    if not cluster.is_server:
        raise ClusterError(
            "tfdist.server: this process is not a parameter server (start it with "
            "`tfdist-run --num-servers K`, or as a TF_CONFIG 'ps' task)."
        )
    address = cluster.server_addresses[cluster.server_index]
    name = f"parameter server {cluster.server_index} ({address})"
    server = ShardServer(address, cluster.world_size, name, cluster.timeout)
    code = server.serve()
    if code:
        print(f"{server.error}", file=sys.stderr, flush=True)
    return code


def main():
    logging.set_verbosity(logging.INFO)
    return run_server(runtime.cluster())


if __name__ == "__main__":
    sys.exit(main())
