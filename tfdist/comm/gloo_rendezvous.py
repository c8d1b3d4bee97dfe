"""Exchanging short strings through Horovod's Gloo rendezvous store (the ranks' side).

Under horovodrun, tfdist's TensorFlow transports swap their "host:port"
through the HTTP key-value store that `horovodrun --gloo` (or
`tfdist-run --horovod`, `tfdist.launch.gloo_rendezvous_server`) runs.
Horovod's own collectives cannot be used for this: any TensorFlow op would
initialize TensorFlow's runtime before its collective server can be
configured.
"""

import os
import time


def all_gather_strings(rank, size, value, timeout, scope="tfdist"):
    """Every rank's `value`, in rank order, through the job's rendezvous store.

    Each rank puts its value under its rank and polls for the others until
    `timeout` seconds have passed; then raises TimeoutError naming the
    missing ranks.
    """
    try:
        address = os.environ["HOROVOD_GLOO_RENDEZVOUS_ADDR"]
        port = os.environ["HOROVOD_GLOO_RENDEZVOUS_PORT"]
    except KeyError:
        raise RuntimeError(
            "tfdist needs Horovod's Gloo rendezvous to exchange addresses under horovodrun: "
            "launch with `horovodrun --gloo`, or use tfdist-run or TF_CONFIG."
        ) from None
    from horovod.runner.http.http_client import put_data_into_kvstore, read_data_from_kvstore

    put_data_into_kvstore(address, port, scope, str(rank), value)
    values = {rank: value}
    deadline = time.monotonic() + timeout
    while len(values) < size:
        for peer in range(size):
            if peer in values:
                continue
            try:
                values[peer] = read_data_from_kvstore(address, port, scope, str(peer))
            except RuntimeError:  # not there yet (404)
                pass
        if len(values) < size:
            if time.monotonic() > deadline:
                missing = sorted(set(range(size)) - set(values))
                raise TimeoutError(
                    f"tfdist rank {rank}: ranks {missing} did not publish their address "
                    f"within the {timeout:g} s timeout."
                )
            time.sleep(0.1)
    return [values[r] for r in range(size)]
