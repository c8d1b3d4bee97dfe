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
              on `Cluster.rendezvous_address` (the first host of the step),
              only for the exchange: closed once every rank has the list;
  mpirun      MPI itself: one non-blocking all-gather (mpi4py).

Through a store: every rank puts its address under its rank; rank 0 reads
them, puts the whole list under one key, and (when it serves the store)
waits until every rank has acknowledged reading it before closing it. The
keys live in a scope named after the job (under srun, its job and step ids),
so two jobs never read each other's. Values are plain UTF-8 "host:port",
checked on arrival (never unpickled). Cost: 2 (P - 1) small PUTs and about
P polls of 0.1 s period per round trip, once per process. Every request and
every wait is bounded by the job timeout; a wait that ends raises
TimeoutError naming the ranks that did not answer (under mpirun, whose
all-gather cannot be cancelled, the job is aborted through MPI after the
message).
"""

import sys
import threading
import time
import urllib.error
import urllib.request

from tfdist import env_vars
from tfdist.env_vars import Foreign
from tfdist.process_setup.cluster import validate_address

_POLL_SECONDS = 0.1
_REQUEST_SECONDS = 5.0  # one HTTP request at most (within what is left of the timeout)
_MPI_MESSAGE_BYTES = 1024
_ALL = "all"


def exchange_worker_addresses(cluster, port):
    """Every rank's "host:port" in rank order, this rank's being `cluster.host`:`port`."""
    own = f"{cluster.host}:{port}"
    if cluster.launcher == "horovodrun":
        store = _horovod_gloo_store()
        return all_gather_strings(cluster.rank, cluster.world_size, own, cluster.timeout,
                                  store, "tfdist-worker-addresses")
    if cluster.launcher == "srun":
        rendezvous = cluster.rendezvous
        server = serve_store(rendezvous.port, cluster) if cluster.rank == 0 else None
        try:
            return all_gather_strings(cluster.rank, cluster.world_size, own, cluster.timeout,
                                      (rendezvous.host, rendezvous.port), rendezvous.scope,
                                      wait_for_acks=server is not None)
        finally:
            if server is not None:
                server.shutdown()
                server.server_close()
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
    """Serve Horovod's key-value store on every interface at `port` (rank 0 under srun).

    Returns the server (running in a daemon thread); the caller shuts it down.
    """
    try:
        from horovod.runner.http import http_server  # pylint: disable=import-outside-toplevel
    except ImportError as e:
        raise RuntimeError(
            f"tfdist: under {cluster.launcher} the workers swap their addresses through "
            f"Horovod's key-value store, and Horovod is not installed ({e}); `make install` "
            "builds it (or give every process TF_CONFIG)."
        ) from e
    try:
        server = http_server.KVStoreHTTPServer(("", port), http_server.KVStoreHandler, 0)
    except OSError as e:
        raise RuntimeError(
            f"tfdist rank 0: cannot serve the address store on port {port} of "
            f"{cluster.rendezvous.host} ({e}); another job may hold it: "
            f"set {env_vars.RENDEZVOUS_PORT} to a free port (the same for every task)."
        ) from e
    threading.Thread(target=server.serve_forever, name="tfdist-address-store",
                     daemon=True).start()
    return server


class _Store:
    """Raw GET/PUT of short UTF-8 values in an HTTP key-value store, each bounded in time."""

    def __init__(self, address, scope, rank, deadline, timeout):
        self.host, self.port = address
        self.scope, self.rank, self.deadline, self.timeout = scope, rank, deadline, timeout

    def _url(self, key):
        return f"http://{self.host}:{self.port}/{self.scope}/{key}"

    def _seconds_left(self):
        return max(0.1, min(_REQUEST_SECONDS, self.deadline - time.monotonic()))

    def put(self, key, value):
        request = urllib.request.Request(self._url(key), data=value.encode(), method="PUT")
        with urllib.request.urlopen(request, timeout=self._seconds_left()):
            pass

    def get(self, key):
        """The value, or None while the key is absent (404) or the store does not answer."""
        try:
            with urllib.request.urlopen(self._url(key), timeout=self._seconds_left()) as reply:
                return reply.read().decode()
        except urllib.error.HTTPError as e:
            if e.code == 404:
                return None
            raise
        except (urllib.error.URLError, OSError):  # not up yet, refused, reset, timed out
            return None

    def put_until_accepted(self):
        """Retry `put`-able: True once the store answers, False when the deadline passed."""
        while time.monotonic() < self.deadline:
            try:
                self.put(f"hello-{self.rank}", "1")
                return True
            except (urllib.error.URLError, OSError):
                time.sleep(_POLL_SECONDS)
        return False

    def wait(self, keys, what):
        """{key: value} for every key in `keys`, polling until the deadline."""
        found = {}
        while True:
            for key in keys:
                if key not in found:
                    value = self.get(key)
                    if value is not None:
                        found[key] = value
            if len(found) == len(keys):
                return found
            if time.monotonic() > self.deadline:
                missing = [key for key in keys if key not in found]
                raise TimeoutError(
                    f"tfdist rank {self.rank}: {what(missing)} within the {self.timeout:g} s "
                    f"timeout (address store {self.host}:{self.port}, scope {self.scope})."
                )
            time.sleep(_POLL_SECONDS)


def all_gather_strings(rank, size, value, timeout, address, scope, wait_for_acks=False):
    """Every rank's "host:port" `value`, in rank order, through the store at `address`.

    Rank 0 collects the values and publishes the list; the others read it.
    With `wait_for_acks` (rank 0 serving the store), rank 0 returns only once
    every rank has read the list, so the store can then be closed.
    """
    deadline = time.monotonic() + timeout
    store = _Store(address, scope, rank, deadline, timeout)
    if not store.put_until_accepted():
        raise TimeoutError(
            f"tfdist rank {rank}: the address store at {address[0]}:{address[1]} did not "
            f"answer within the {timeout:g} s timeout (under srun rank 0 serves it on the "
            f"first host of the job step; {env_vars.RENDEZVOUS_HOST} names another)."
        )
    store.put(str(rank), value)
    if rank == 0:
        peers = store.wait([str(r) for r in range(size)],
                           lambda missing: f"ranks {', '.join(missing)} did not publish "
                                           "their address")
        values = [peers[str(r)] for r in range(size)]
        for r, address_text in enumerate(values):
            validate_address(address_text, f"the address rank {r} published")
        store.put(_ALL, ",".join(values))
        if wait_for_acks:
            store.wait([f"ack-{r}" for r in range(1, size)],
                       lambda missing: f"{', '.join(missing)} (ranks that never read the "
                                       "list) missing")
        return values
    values = store.wait([_ALL], lambda _: "rank 0 did not publish the addresses")[_ALL]
    values = values.split(",")
    if len(values) != size:
        raise RuntimeError(f"tfdist rank {rank}: the address list has {len(values)} entries "
                           f"for {size} ranks: {values}")
    for r, address_text in enumerate(values):
        validate_address(address_text, f"the address list's entry {r}")
    store.put(f"ack-{rank}", "1")
    return values


def mpi_all_gather_strings(rank, size, value, timeout):
    """Every rank's `value` through one MPI all-gather, bounded by `timeout` seconds.

    A pending MPI collective cannot be cancelled (and MPI_Finalize would wait
    for it), so on timeout the message is printed and the job aborted.
    """
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
            print(f"tfdist rank {rank}: not every rank joined the address exchange within the "
                  f"{timeout:g} s timeout (a rank stuck before creating its strategy?); "
                  "aborting the MPI job.", file=sys.stderr, flush=True)
            comm.Abort(1)
        time.sleep(0.01)
    return [bytes(row).rstrip(b"\0").decode() for row in received]
