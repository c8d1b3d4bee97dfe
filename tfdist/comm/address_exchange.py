"""Swapping the workers' "host:port" where the launcher does not hand them out.

TensorFlow's collectives need every worker's address before the first
collective op, and before any TensorFlow op has started TensorFlow's runtime
(its collective server can only be configured before that). tfdist-run,
TF_CONFIG and the Kubernetes example give the addresses; the other launchers
only say who is who, so each rank picks a free port and the ranks swap
"host:port" through an engine the launcher already runs:

  horovodrun  the HTTP key-value store `horovodrun --gloo` (or `tfdist-run
              --horovod`) runs for Gloo's rendezvous (HOROVOD_GLOO_RENDEZVOUS_*);
  srun        the same store (Horovod's `KVStoreHTTPServer`), served by rank 0
              on `Cluster.rendezvous_address` (the first host of the step);
  mpirun      MPI itself: one non-blocking all-gather (mpi4py).

Cost: one round of P small messages, once per process. Every wait ends after
the job timeout with a TimeoutError naming the ranks that did not answer.
"""

import os
import time

_POLL_SECONDS = 0.1
_MPI_MESSAGE_BYTES = 1024


def exchange_worker_addresses(cluster, port):
    """Every rank's "host:port" in rank order, this rank's being `cluster.host`:`port`."""
    own = f"{cluster.host}:{port}"
    scope = "tfdist-worker-addresses"
    if cluster.launcher == "horovodrun":
        address, store_port = _horovod_gloo_store()
        return all_gather_strings(cluster.rank, cluster.world_size, own, cluster.timeout,
                                  address, store_port, scope)
    if cluster.launcher == "srun":
        address, store_port = cluster.rendezvous_address.rsplit(":", 1)
        if cluster.rank == 0:
            serve_store(int(store_port), cluster)
        return all_gather_strings(cluster.rank, cluster.world_size, own, cluster.timeout,
                                  address, store_port, scope)
    if cluster.launcher == "mpirun":
        return mpi_all_gather_strings(cluster.rank, cluster.world_size, own, cluster.timeout)
    raise RuntimeError(
        f"tfdist rank {cluster.rank}: launched by {cluster.launcher} without worker addresses; "
        "TensorFlow collectives need them (use tfdist-run, TF_CONFIG, horovodrun, mpirun or srun)."
    )


def _horovod_gloo_store():
    try:
        return (os.environ["HOROVOD_GLOO_RENDEZVOUS_ADDR"],
                os.environ["HOROVOD_GLOO_RENDEZVOUS_PORT"])
    except KeyError:
        raise RuntimeError(
            "tfdist needs Horovod's Gloo rendezvous to exchange addresses under horovodrun: "
            "launch with `horovodrun --gloo`, or use tfdist-run or TF_CONFIG."
        ) from None


def _import_kvstore(launcher):
    try:
        from horovod.runner.http import http_client, http_server  # pylint: disable=import-outside-toplevel
    except ImportError as e:
        raise RuntimeError(
            f"tfdist: under {launcher} the workers swap their addresses through Horovod's "
            f"rendezvous store, and Horovod is not installed ({e}); `make install` builds it "
            "(or give every process TF_CONFIG)."
        ) from e
    return http_client, http_server


_served = []  # the store of this process (rank 0 under srun), kept for the process's life


def serve_store(port, cluster):
    """Serve Horovod's key-value store on every interface at `port` (rank 0 under srun)."""
    _, http_server = _import_kvstore(cluster.launcher)
    try:
        server = http_server.KVStoreHTTPServer(("", port), http_server.KVStoreHandler, 0)
    except OSError as e:
        raise RuntimeError(
            f"tfdist rank 0: cannot serve the address store on port {port} of "
            f"{cluster.rendezvous_address.rsplit(':', 1)[0]} ({e}); another job may hold it: "
            "set TFDIST_RENDEZVOUS_PORT to a free port (the same for every task)."
        ) from e
    import threading  # pylint: disable=import-outside-toplevel

    threading.Thread(target=server.serve_forever, name="tfdist-address-store",
                     daemon=True).start()
    _served.append(server)
    return server


def all_gather_strings(rank, size, value, timeout, address, port, scope="tfdist"):
    """Every rank's `value`, in rank order, through the key-value store at `address`:`port`.

    Each rank puts its value under its rank (retrying while the store is
    not up yet) and polls for the others until `timeout` seconds have
    passed; then raises TimeoutError naming the missing ranks.
    """
    http_client, _ = _import_kvstore("this launcher")
    deadline = time.monotonic() + timeout
    while True:
        try:
            http_client.put_data_into_kvstore(address, port, scope, str(rank), value)
            break
        except RuntimeError as e:  # the store is not up yet (rank 0 still starting)
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"tfdist rank {rank}: the address store at {address}:{port} did not answer "
                    f"within the {timeout:g} s timeout ({e.args[-1]}); rank 0 serves it on the "
                    "first host of the job step."
                ) from None
            time.sleep(_POLL_SECONDS)
    values = {rank: value}
    while len(values) < size:
        for peer in range(size):
            if peer in values:
                continue
            try:
                values[peer] = http_client.read_data_from_kvstore(address, port, scope, str(peer))
            except RuntimeError:  # not there yet (404)
                pass
        if len(values) < size:
            if time.monotonic() > deadline:
                missing = sorted(set(range(size)) - set(values))
                raise TimeoutError(
                    f"tfdist rank {rank}: ranks {missing} did not publish their address "
                    f"within the {timeout:g} s timeout."
                )
            time.sleep(_POLL_SECONDS)
    return [values[r] for r in range(size)]


def mpi_all_gather_strings(rank, size, value, timeout):
    """Every rank's `value` through one MPI all-gather, bounded by `timeout` seconds."""
    try:
        from mpi4py import MPI  # pylint: disable=import-outside-toplevel
    except ImportError as e:
        raise RuntimeError(
            f"tfdist rank {rank}: under mpirun the workers swap their addresses through MPI, "
            f"which needs mpi4py ({e}): pip install \"tfdist[mpi]\" (or make install)."
        ) from e
    import numpy as np  # pylint: disable=import-outside-toplevel

    comm = MPI.COMM_WORLD
    if (comm.Get_rank(), comm.Get_size()) != (rank, size):
        raise RuntimeError(
            f"tfdist: MPI says rank {comm.Get_rank()} of {comm.Get_size()} but mpirun's "
            f"environment says rank {rank} of {size}."
        )
    encoded = value.encode()
    if len(encoded) > _MPI_MESSAGE_BYTES:
        raise ValueError(f"tfdist rank {rank}: address too long for the exchange: {value!r}")
    send = np.zeros(_MPI_MESSAGE_BYTES, np.uint8)
    send[: len(encoded)] = np.frombuffer(encoded, np.uint8)
    received = np.zeros((size, _MPI_MESSAGE_BYTES), np.uint8)
    request = comm.Iallgather(send, received)
    deadline = time.monotonic() + timeout
    while not request.Test():
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"tfdist rank {rank}: not every rank joined the address exchange within the "
                f"{timeout:g} s timeout (a rank stuck before creating its strategy?)."
            )
        time.sleep(0.01)
    return [bytes(row).rstrip(b"\0").decode() for row in received]
