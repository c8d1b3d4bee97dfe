"""Swapping the workers' "host:port" where the launcher does not hand them out.

TensorFlow's collectives need every worker's address before the first
collective op, and before any TensorFlow op has started TensorFlow's runtime
(its collective server can only be configured before that). tfdist-run,
TF_CONFIG and the Kubernetes example give the addresses; the other launchers
only say who is who, so each rank picks a free port and the ranks swap
"host:port" through an engine the launcher already runs:

  horovodrun  the HTTP key-value store `horovodrun --gloo` (or `tfdist-run
              --horovod`) runs for Gloo's rendezvous (HOROVOD_GLOO_RENDEZVOUS_*);
  srun        a store of the same protocol (`tfdist.comm.address_store`), served
              by rank 0 on `Cluster.rendezvous` (the first host of the step;
              loopback for a step on one node), only for the exchange: closed
              once every rank has the list; it refuses requests not signed
              with the job's secret (`TFDIST_SECRET`, when the job has one);
  mpirun      MPI itself: one non-blocking all-gather (mpi4py).

The gathers themselves (`tfdist.comm.launcher_channel`) are bounded by the job
timeout and check every value on arrival (`validate_address`): a rank that sent
anything else is named. Cost: once per process, a few small requests through
the store, or one MPI all-gather.
"""

from tfdist import env_vars
from tfdist.env_vars import Foreign
from tfdist.comm import ports
from tfdist.comm.address_store import AddressStore
from tfdist.comm.launcher_channel import gather_through_mpi, gather_through_store
from tfdist.process_setup import job_secret
from tfdist.process_setup.cluster import validate_address

_MPI_MESSAGE_BYTES = 1024


def _check_address(value, sender):
    validate_address(value, f"the address of rank {sender}")


def all_gather_strings(rank, size, value, timeout, address, scope, wait_for_acks=False):
    """Every rank's "host:port" `value`, in rank order, through the store at `address`."""
    return gather_through_store(rank, size, value, timeout, address, scope, _check_address,
                                "the address exchange", wait_for_acks)


def mpi_all_gather_strings(rank, size, value, timeout):
    """Every rank's "host:port" `value`, in rank order, through one MPI all-gather."""
    return gather_through_mpi(rank, size, value, timeout, _check_address,
                              "the address exchange", capacity=_MPI_MESSAGE_BYTES)


def exchange_worker_addresses(cluster, port):
    """Every rank's "host:port" in rank order, this rank's being `cluster.host`:`port`."""
    own = f"{cluster.host}:{port}"
    if cluster.launcher == "horovodrun":
        store = _horovod_gloo_store()
        return all_gather_strings(cluster.rank, cluster.world_size, own, cluster.timeout,
                                  store, "tfdist-worker-addresses")
    if cluster.launcher == "srun":
        rendezvous = cluster.rendezvous
        # A step on one node swaps through loopback (the node's own name may resolve to
        # another loopback address, as Debian's 127.0.1.1, where the store does not listen).
        host = ports.LOOPBACK if cluster.on_one_host else rendezvous.host
        server = serve_store(rendezvous.port, cluster) if cluster.rank == 0 else None
        try:
            return all_gather_strings(cluster.rank, cluster.world_size, own, cluster.timeout,
                                      (host, rendezvous.port), rendezvous.scope,
                                      wait_for_acks=server is not None)
        finally:
            if server is not None:
                server.close()
    if cluster.launcher == "mpirun":
        return mpi_all_gather_strings(cluster.rank, cluster.world_size, own, cluster.timeout)
    raise RuntimeError(
        f"tfdist rank {cluster.rank}: launched by {cluster.launcher} without worker addresses; "
        "TensorFlow collectives need them (use tfdist-run, TF_CONFIG, horovodrun, mpirun or srun)."
    )


def _horovod_gloo_store():
    address = Foreign.HOROVOD_GLOO_RENDEZVOUS_ADDR.get()
    port = Foreign.HOROVOD_GLOO_RENDEZVOUS_PORT.get()
    if address is None or port is None:
        raise RuntimeError(
            "tfdist needs Horovod's Gloo rendezvous to exchange addresses under horovodrun: "
            "launch with `horovodrun --gloo`, or use tfdist-run or TF_CONFIG.")
    return address, port


def serve_store(port, cluster):
    """Serve the job's address store (`tfdist.comm.address_store`, rank 0 under srun) at
    `port`, where the job's peers are (`tfdist.comm.ports.listen_address`); the caller
    closes it."""
    listen = ports.listen_address(cluster.on_one_host, cluster.rendezvous.host)
    try:
        return AddressStore((listen, port), job_secret.job_secret(),
                            f"rank 0's address store (port {port})")
    except OSError as e:
        raise RuntimeError(
            f"tfdist rank 0: cannot serve the address store on port {port} of "
            f"{cluster.rendezvous.host} ({e}); another job may hold it: "
            f"set {env_vars.RENDEZVOUS_PORT} to a free port (the same for every task)."
        ) from e


