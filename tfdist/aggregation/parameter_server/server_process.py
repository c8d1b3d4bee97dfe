"""A parameter-server process: `python -m tfdist.server` (this module's `main`).

Serves one shard of `ParameterServerStrategy` until every worker has
finished (exit code 0) or a worker fails (exit code 1, with a message naming
it).

Dedicated servers learn their index, address and the workers from
`tfdist-run --num-servers K` or from a `TF_CONFIG` `ps` task, like any tfdist
process. A training script started in a server role (which is what
`tfdist-run --num-servers K` and a TFJob's `ps` replicas do) enters the same
server when it creates its `ParameterServerStrategy`, and exits there: the
rest of the script runs only on workers.

Co-located servers (no dedicated ones in the cluster) are started by each
worker as a child process with explicit arguments:

    python -m tfdist.server --address HOST:PORT --name NAME --num-workers P
                            [--listen IP] [--worker-addresses A,B,...] [--timeout S]

It listens where the job's peers are (`tfdist.comm.ports.listen_address`: loopback when
every process runs on this machine) on the port of its address.
"""

import argparse
import dataclasses
import sys

from absl import logging

from tfdist.comm import ports
from tfdist.process_setup import cluster as cluster_lib
from tfdist.errors import ClusterError


@dataclasses.dataclass(frozen=True)
class ServerOutcome:
    """How a server ended: its exit code (0, or 1 after a failure it reported) and whether
    the interpreter may be torn down (False: a reducer thread is still inside TensorFlow,
    and finalizing the runtime under it could crash; the entry point then leaves at once)."""

    code: int
    teardown_safe: bool = True


def serve(address, num_workers, name, timeout, worker_addresses, listen):
    """Run one shard server at `address` (listening on `listen`: an IP, or "" for every
    interface) until it is done; return its `ServerOutcome`."""
    from tfdist.aggregation.parameter_server.shard_server import ShardServer

    server = ShardServer(address, num_workers, name, timeout, worker_addresses, listen)
    code = server.serve()
    if code:
        print(server.error, file=sys.stderr, flush=True)
    if not server.reducers_stopped:
        logging.warning("tfdist %s: a reducer did not stop; the process should exit without "
                        "cleanup", name)
    return ServerOutcome(code, teardown_safe=server.reducers_stopped)


def run_server(cluster):
    """Serve shard `cluster.server_index` of a cluster with dedicated servers."""
    if not cluster.is_server:
        raise ClusterError(
            "tfdist.server: this process is not a parameter server (start it with "
            "`tfdist-run --num-servers K`, or as a TF_CONFIG 'ps' task)."
        )
    address = cluster.server_addresses[cluster.server_index]
    listen = ports.listen_address(cluster.on_one_host, address.rsplit(":", 1)[0])
    return serve(address, cluster.world_size, f"parameter server {cluster.server_index} "
                 f"({address})", cluster.timeout, cluster.worker_addresses, listen)


def main(argv=None):
    """The server's command line (`python -m tfdist.server`); returns its `ServerOutcome`."""
    parser = argparse.ArgumentParser(prog="python -m tfdist.server",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--address", help="host:port to serve on (co-located server)")
    parser.add_argument("--name", default=None, help="how messages name this server")
    parser.add_argument("--listen", default=ports.EVERY_INTERFACE,
                        help="the IP address to listen on (default: every interface)")
    parser.add_argument("--num-workers", type=int)
    parser.add_argument("--worker-addresses", default="")
    parser.add_argument("--timeout", type=float, default=None)
    args = parser.parse_args(argv)
    logging.set_verbosity(logging.INFO)
    if args.address is None:
        return run_server(cluster_lib.discover())
    if not args.num_workers or args.num_workers < 1:
        parser.error("--num-workers must be >= 1 with --address")
    timeout = args.timeout or cluster_lib.discover().timeout
    workers = [a for a in args.worker_addresses.split(",") if a]
    return serve(args.address, args.num_workers, args.name or f"parameter server ({args.address})",
                 timeout, workers, args.listen)
