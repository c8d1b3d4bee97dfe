"""The job's secret: what tfdist's own servers check before they answer a peer.

Every process of a job holds the same secret (`TFDIST_SECRET`): tfdist-run makes a new
random one per job (`new_secret`) unless one is set; under mpirun, `srun --mpi=pmix` and
`horovodrun --mpi`, rank 0 makes one and sends it through MPI at start-up when none is set
(`tfdist.comm.rank_agreement`); under other launchers (srun without PMIx, horovodrun on
Gloo, TF_CONFIG, Kubernetes, Ray) it is the `TFDIST_SECRET` the user gives every process
(Kubernetes: a Secret), else there is none and tfdist's servers answer anyone, as before.

What checks it, as Horovod's runner checks `HOROVOD_SECRET_KEY` (an HMAC-SHA256 of each
request):
* the address store of an srun job (`tfdist.comm.address_store`): every request carries
  an HMAC of its method, path and body (`sign`);
* a liveness port of the MPI engine (`tfdist.comm.mpi`): a probe sends a token derived
  from the secret (`token`);
* the parameter servers and the chief's save service, on TensorFlow's RPC runtime
  (`tfdist.comm.tf_rpc`): every call carries the token as its first argument.
A request without it is refused (and logged, once per peer address); the job goes on.
What tfdist does not serve cannot check it: TensorFlow's gRPC server (the collective
engine) and Horovod's Gloo rendezvous store take no credentials (see the docs' Security
page). The secret never travels: only HMACs of it do, over plain TCP (so the checks keep
out strangers and scanners on the network, not an eavesdropper who replays a request).
"""

import hashlib
import hmac
import logging
import secrets
import threading
from typing import Optional

from tfdist import env_vars


def new_secret() -> str:
    """A fresh random secret (256 bits, hex)."""
    return secrets.token_hex(32)


def job_secret(environ=None) -> Optional[bytes]:
    """The job's secret (`TFDIST_SECRET`), or None where the job has none."""
    value = env_vars.SECRET.get(environ)
    return value.encode() if value else None


def token(secret: Optional[bytes], purpose: str) -> str:
    """The token a request to one kind of server (`purpose`) carries: HMAC-SHA256 of the
    purpose under the secret, hex ("" when the job has no secret)."""
    if secret is None:
        return ""
    return hmac.new(secret, purpose.encode(), hashlib.sha256).hexdigest()


def sign(secret: Optional[bytes], *parts: bytes) -> str:
    """HMAC-SHA256 of `parts` (each length-prefixed) under the secret, hex ("" without one)."""
    if secret is None:
        return ""
    mac = hmac.new(secret, digestmod=hashlib.sha256)
    for part in parts:
        mac.update(len(part).to_bytes(8, "big"))
        mac.update(part)
    return mac.hexdigest()


def verify(secret: Optional[bytes], signature: str, *parts: bytes) -> bool:
    """True when `signature` is `sign(secret, *parts)` (always, without a secret)."""
    if secret is None:
        return True
    return hmac.compare_digest(signature or "", sign(secret, *parts))


class Refusals:
    """What a server refused for want of the secret, said once per peer address (a warning
    through Python's logging, which absl's handler shows): the job goes on.

    Args:
        name: how the line names the server ("rank 0's address store").
    """

    def __init__(self, name: str):
        self.name = name
        self._peers: set = set()
        self._lock = threading.Lock()

    def refused(self, peer: str) -> None:
        with self._lock:
            first = peer not in self._peers
            self._peers.add(peer)
        if first:
            logging.getLogger("absl").warning(
                "tfdist: %s refused a request from %s without the job's secret (%s); the job "
                "goes on", self.name, peer, env_vars.SECRET.name)
