"""A worker's co-located shard server: a child process with an explicit lifecycle.

Without dedicated servers (e.g. under horovodrun) every worker hosts one
shard server, so K = P. It runs as a separate process, not a thread, so the
server's functions never run beside this process's tracing of the training
functions. The child dies with its parent (`tfdist.process_setup.child_processes`).

`close()` waits for the server to finish - it stops once every worker said
goodbye, and peers may still be pulling sums from it when this worker is
done - and kills it after the job timeout.
"""

import os
import subprocess
import sys

from tfdist.env_vars import Foreign
from tfdist import env_vars
from tfdist.process_setup.child_processes import die_with_parent
from tfdist.comm import ports


class ColocatedServer:
    """Start this worker's shard server; `addresses` are every worker's servers.

    Args:
        cluster: this worker's `tfdist.process_setup.cluster.Cluster`.
        communicator: the job's `tfdist.comm.base.Communicator` (to swap addresses).
    """

    def __init__(self, cluster, communicator):
        host = cluster.worker_addresses[cluster.rank].rsplit(":", 1)[0]
        listen = ports.listen_address(cluster.on_one_host, host)
        # held until the job ends: the server binds beside it (gRPC sets SO_REUSEPORT)
        self._held_port = ports.reserve_ports(1, listen, port_range=ports.job_port_range())[0]
        address = f"{host}:{self._held_port.port}"
        name = f"parameter server {cluster.rank} ({address}, on rank {cluster.rank})"
        env = {k: v for k, v in os.environ.items()
               if not k.startswith((env_vars.PREFIX, "HOROVOD_")) or k == env_vars.SECRET.name}
        env[Foreign.TF_CPP_MIN_LOG_LEVEL.name] = Foreign.TF_CPP_MIN_LOG_LEVEL.get(default="2")
        env.pop(Foreign.TF_CONFIG.name, None)
        self.timeout = cluster.timeout
        self.process = subprocess.Popen(  # pylint: disable=consider-using-with
            [sys.executable, "-m", "tfdist.server", "--address", address, "--name", name,
             "--listen", listen, "--num-workers", str(cluster.world_size), "--worker-addresses",
             ",".join(cluster.worker_addresses), "--timeout", str(cluster.timeout)],
            env=env, preexec_fn=die_with_parent)
        self.addresses = communicator.all_gather_strings(address)

    def close(self):
        """Wait for the server to stop (all workers said goodbye); kill it after the timeout."""
        try:
            self.process.wait(timeout=self.timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        finally:
            self._held_port.release()

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()
