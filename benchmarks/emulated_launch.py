"""Start a job of `emulated_worker.py` on an emulated cluster (or on loopback), one way each.

* `run_tf_config`: one process per host namespace, each with a `TF_CONFIG` that
  names the hosts' addresses (workers on hosts 0 .. P-1, optional `ps` tasks
  on hosts after them), as a Kubeflow TFJob would start them;
* `run_horovodrun`: `horovodrun --gloo -np P -H 10.77.0.1:1,...` from a head
  host of its own, reaching the hosts through the `ssh` of
  `benchmarks.netns_ssh` (which enters the host's namespace);
* `run_loopback`: `tfdist-run --horovod --num-servers 1` on this machine's
  loopback, for the cost model's fit.

Every job runs through `tfdist.launch.processes.ProcessGroup` (labelled output,
first failure stops the job) and returns the per-rank span files' contents.
"""

import json
import os
import sys
import tempfile

from benchmarks.netns_ssh import HOSTS_ENV, install_ssh_shim
from tfdist.launch.output_filter import OutputFilter
from tfdist.launch.processes import ProcessGroup

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "emulated_worker.py")
PORT = 23456  # every host is its own namespace: the same port everywhere
HOROVODRUN = os.path.join(os.path.dirname(sys.executable), "horovodrun")


def _environment(**extra):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("TFDIST_", "HOROVOD_")) and k != "TF_CONFIG"}
    env.update(TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1", **extra)
    return env


def _worker_args(out, sizes, rounds, methods):
    return [sys.executable, WORKER, out, ",".join(map(str, sizes)), str(rounds),
            ",".join(methods)]


def _run(group, workers, out, num_proc, what):
    print(what, flush=True)
    code = group.wait(workers=workers)
    if code != 0:
        raise RuntimeError(f"emulated-cluster job failed with exit code {code}")
    ranks = []
    for rank in range(num_proc):
        with open(f"{out}.rank{rank}") as f:
            ranks.append(json.load(f))
    return ranks


def run_tf_config(network, num_proc, num_servers, out, sizes, rounds, methods):
    """Workers on hosts 0 .. P-1 and `num_servers` ps tasks on hosts P_max.. (see module doc)."""
    workers = [f"{network.address(h)}:{PORT}" for h in range(num_proc)]
    server_hosts = [network.num_hosts - 2 - k for k in range(num_servers)]
    cluster = {"worker": workers}
    if num_servers:
        cluster["ps"] = [f"{network.address(h)}:{PORT}" for h in server_hosts]
    tasks = [("worker", r, h) for r, h in enumerate(range(num_proc))]
    tasks += [("ps", k, h) for k, h in enumerate(server_hosts)]
    group = ProcessGroup(output_filter=OutputFilter())
    group.forward_signals()
    for job, index, host in tasks:
        config = json.dumps({"cluster": cluster, "task": {"type": job, "index": index}})
        group.start(str(index) if job == "worker" else f"s{index}",
                    network.exec_prefix(host) + _worker_args(out, sizes, rounds, methods),
                    _environment(TF_CONFIG=config))
    return _run(group, [str(r) for r in range(num_proc)], out, num_proc,
                f"TF_CONFIG job, one process per host: {json.dumps(cluster)}")


def run_horovodrun(network, num_proc, out, sizes, rounds, methods):
    """horovodrun -H over hosts 0 .. P-1, started on the head host (the network's last)."""
    head = network.num_hosts - 1
    hosts = ",".join(f"{network.address(h)}:1" for h in range(num_proc))
    namespaces = ",".join(f"{network.address(h)}={network.namespace(h)}"
                          for h in range(network.num_hosts))
    with tempfile.TemporaryDirectory() as shim:
        install_ssh_shim(shim)
        env = _environment(PATH=f"{shim}:{os.environ.get('PATH', '')}",
                           **{HOSTS_ENV: namespaces})
        group = ProcessGroup(output_filter=OutputFilter())
        group.forward_signals()
        command = [HOROVODRUN, "--gloo", "--disable-cache", "--start-timeout", "120",
                   "-np", str(num_proc), "-H", hosts] + _worker_args(out, sizes, rounds, methods)
        group.start("horovodrun", network.exec_prefix(head) + command, env)
        return _run(group, ["horovodrun"], out, num_proc,
                    f"on {network.address(head)}: $ {' '.join(command)}")


def run_loopback(num_proc, out, sizes, rounds, methods):
    """tfdist-run --horovod --num-servers 1 -np P on this machine (127.0.0.1)."""
    group = ProcessGroup(output_filter=OutputFilter())
    group.forward_signals()
    command = [sys.executable, "-m", "tfdist.launch", "-np", str(num_proc), "--horovod",
               "--num-servers", "1"] + _worker_args(out, sizes, rounds, methods)
    group.start("tfdist-run", command, _environment())
    return _run(group, ["tfdist-run"], out, num_proc, f"loopback: $ {' '.join(command)}")
