"""All-gathers of short strings through what the launcher already runs, before any engine.

Before a communicator exists, the ranks of a job may still need to swap a few bytes: their
addresses (`tfdist.comm.address_exchange`), what each can run and which versions it runs
(`tfdist.comm.rank_agreement`). These gathers go through a channel the launcher provides:

* an HTTP key-value store (`gather_through_store`): Horovod's rendezvous store under
  horovodrun and tfdist-run, rank 0's address store under srun
  (`tfdist.comm.address_store`). Every rank puts its value under its rank; rank 0 reads
  them, checks them, and publishes the list (JSON) under one key; every rank reads it and,
  where rank 0 serves the store (`wait_for_acks`), acknowledges it before rank 0 closes
  it. Requests carry the job's secret's HMAC (`address_store.SIGNATURE_HEADER`). Cost:
  2 (P - 1) small PUTs and about P polls of 0.1 s period per round trip;
* MPI itself (`gather_through_mpi`): one non-blocking all-gather of fixed-size buffers
  (mpi4py), polled, so that the timeout holds (a pending MPI collective cannot be
  cancelled: at the timeout the job is aborted through MPI, after the message).

Every value is checked on arrival (`check(value, sender)` raises a ValueError naming what
is wrong); one that fails the check fails the gather with a `ClusterError` naming the rank
that sent it. Every request and every wait is bounded by the job timeout, and a wait that
ends raises TimeoutError naming the ranks that did not answer.
"""

import json
import sys
import time
import urllib.error
import urllib.request

from tfdist import env_vars
from tfdist.comm.address_store import SIGNATURE_HEADER, signature
from tfdist.comm.mpi_init import initialized_mpi
from tfdist.errors import ClusterError
from tfdist.process_setup import job_secret

_POLL_SECONDS = 0.1
_REQUEST_SECONDS = 5.0  # one HTTP request at most (within what is left of the timeout)
_ALL = "all"


def _checked(value, sender, rank, check, what):
    try:
        check(value, sender)
    except ValueError as error:
        raise ClusterError(
            f"tfdist rank {rank}: {what}: rank {sender} sent {str(value)[:120]!r}, which is not "
            f"what the exchange expects ({error}); that rank is not running the same exchange - "
            "are the ranks running different versions of the script or of tfdist?") from None
    return value


class _Store:
    """Raw GET/PUT of short UTF-8 values in an HTTP key-value store, each bounded in time."""

    def __init__(self, address, scope, rank, deadline, timeout):
        self.host, self.port = address
        self.scope, self.rank, self.deadline, self.timeout = scope, rank, deadline, timeout
        self._secret = job_secret.job_secret()

    def _url(self, key):
        return f"http://{self.host}:{self.port}/{self.scope}/{key}"

    def _request(self, key, method, body=None):
        """A request signed with the job's secret (a store that checks none ignores it)."""
        path = f"/{self.scope}/{key}"
        return urllib.request.Request(
            self._url(key), data=body, method=method,
            headers={SIGNATURE_HEADER: signature(self._secret, method, path, body or b"")})

    def _seconds_left(self):
        return max(0.1, min(_REQUEST_SECONDS, self.deadline - time.monotonic()))

    def put(self, key, value):
        request = self._request(key, "PUT", value.encode())
        try:
            with urllib.request.urlopen(request, timeout=self._seconds_left()):
                pass
        except urllib.error.HTTPError as e:
            raise self._refused(e) if e.code == 403 else e

    def get(self, key):
        """The value, or None while the key is absent (404) or the store does not answer."""
        try:
            with urllib.request.urlopen(self._request(key, "GET"),
                                        timeout=self._seconds_left()) as reply:
                return reply.read().decode()
        except urllib.error.HTTPError as e:
            if e.code == 404:
                return None
            raise self._refused(e) if e.code == 403 else e
        except (urllib.error.URLError, OSError, UnicodeDecodeError):
            return None  # not up yet, refused, reset, timed out, not text

    def _refused(self, error):
        return ClusterError(
            f"tfdist rank {self.rank}: the store at {self.host}:{self.port} refused this "
            f"rank's request ({error}): the ranks hold different {env_vars.SECRET} values - "
            "give every process the same one, or none")

    def put_until_accepted(self):
        """Retry a PUT: True once the store answers, False when the deadline passed."""
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
                    f"timeout (store {self.host}:{self.port}, scope {self.scope})."
                )
            time.sleep(_POLL_SECONDS)


def gather_through_store(rank, size, value, timeout, address, scope, check, what,
                         wait_for_acks=False):
    """Every rank's `value` (a str), in rank order, through the store at `address` (host,
    port) in `scope`; see the module docstring. `what` names the exchange in messages."""
    deadline = time.monotonic() + timeout
    store = _Store(address, scope, rank, deadline, timeout)
    if not store.put_until_accepted():
        raise TimeoutError(
            f"tfdist rank {rank}: the store at {address[0]}:{address[1]} did not answer within "
            f"the {timeout:g} s timeout ({what}; under srun rank 0 serves it on the first host "
            f"of the job step, {env_vars.RENDEZVOUS_HOST} names another)."
        )
    store.put(str(rank), value)
    if rank == 0:
        peers = store.wait([str(r) for r in range(size)],
                           lambda missing: f"{what}: ranks {', '.join(missing)} sent nothing")
        values = [_checked(peers[str(r)], r, rank, check, what) for r in range(size)]
        store.put(_ALL, json.dumps(values))
        if wait_for_acks:
            store.wait([f"ack-{r}" for r in range(1, size)],
                       lambda missing: f"{what}: {', '.join(missing)} (ranks that never read "
                                       "the list) missing")
        return values
    published = store.wait([_ALL], lambda _: f"{what}: rank 0 did not publish the list")[_ALL]
    try:
        values = json.loads(published)
        if not (isinstance(values, list) and len(values) == size
                and all(isinstance(v, str) for v in values)):
            raise ValueError(f"not a list of {size} strings")
    except ValueError as error:
        raise ClusterError(f"tfdist rank {rank}: {what}: rank 0's list is malformed "
                           f"({error}): {published[:120]!r}") from None
    values = [_checked(v, r, rank, check, what) for r, v in enumerate(values)]
    store.put(f"ack-{rank}", "1")
    return values


def gather_through_mpi(rank, size, value, timeout, check, what, capacity=4096):
    """Every rank's `value` (a str of at most `capacity` UTF-8 bytes), in rank order, through
    one MPI all-gather bounded by `timeout` seconds; see the module docstring."""
    try:
        MPI = initialized_mpi(rank, timeout)  # pylint: disable=invalid-name
    except ImportError as e:
        raise ClusterError(
            f"tfdist rank {rank}: this process is one of an MPI job's, whose ranks swap what "
            f"they need through MPI ({what}), and it cannot import mpi4py ({e}): install "
            "\"tfdist[mpi]\" on every host (or make install).") from e
    import numpy as np  # pylint: disable=import-outside-toplevel

    comm = MPI.COMM_WORLD
    if (comm.Get_rank(), comm.Get_size()) != (rank, size):
        raise ClusterError(
            f"tfdist: MPI says rank {comm.Get_rank()} of {comm.Get_size()} but the launcher's "
            f"environment says rank {rank} of {size}.")
    encoded = value.encode()
    if len(encoded) > capacity:
        raise ValueError(f"tfdist rank {rank}: {what}: a value of {len(encoded)} bytes is "
                         f"over the {capacity} the exchange carries: {value[:80]!r}")
    send = np.zeros(capacity, np.uint8)
    send[: len(encoded)] = np.frombuffer(encoded, np.uint8)
    received = np.zeros((size, capacity), np.uint8)
    request = comm.Iallgather(send, received)
    deadline = time.monotonic() + timeout
    while not request.Test():
        if time.monotonic() > deadline:
            print(f"tfdist rank {rank}: not every rank joined {what} within the {timeout:g} s "
                  "timeout (a rank stuck before creating its strategy, or one that chose "
                  "another engine?); aborting the MPI job.", file=sys.stderr, flush=True)
            comm.Abort(1)
        time.sleep(0.01)
    values = []
    for sender, row in enumerate(received):
        raw = bytes(row).rstrip(b"\0")
        try:
            text = raw.decode()
        except UnicodeDecodeError:
            text = repr(raw[:64])
            _checked(text, sender, rank, _never, what)
        values.append(_checked(text, sender, rank, check, what))
    return values


def _never(value, sender):
    del value, sender
    raise ValueError("not UTF-8 text")
