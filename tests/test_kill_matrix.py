"""The kill matrix: SIGKILL one process of a job at a chosen moment; the rest must fail cleanly.

For each case a real job runs tests/scripts/kill_target.py; when the victim
announces the phase (start-up, mid-training, during `evaluate`, while the
chief writes a checkpoint) the test SIGKILLs it. Then:

* every surviving process exits non-zero within the ceiling, and the output
  names the dead process (the launcher's line, or the survivor's own
  message when there is no launcher);
* no process of the job is left behind;
* the checkpoint, if one was written, loads (never a torn file).

The cluster engines' launchers (mpirun, srun, Ray Train) are each killed a
worker too; their own message names it ("process rank 1", "task 1"; Ray's
error is printed by tests/scripts/ray_train_job.py).

Killing `tfdist-run` itself ends its processes (the kernel SIGTERMs them);
they have no terminal left to explain it to, so only "nothing left behind"
is checked. The fast cases run in `make test`, the rest in `make test-all`.

The restart column (`make test-all`; `make test` restarts a killed ring job
in test_resume.py): each `tfdist-run` case of a synchronous strategy again,
with `BackupAndRestore` in the script and `--max-restarts 1`: the job
restarts by itself, resumes from the backup (or from the beginning where
it died before one) and ends with the weights of the plain script run
once, never killed (1e-4).
"""

import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time

import keras
import numpy as np
import pytest

from helpers import case_parameters, require_launcher, script, start_job, tf_config_job

RUN_TIMEOUT = 60  # the job's timeout: every survivor must give up by itself before the ceiling
# Cases whose survivors notice the death only when a wait times out, given a shorter job
# timeout: the asynchronous worker may wait out a pull from a dead server (60 s of 68 at the
# default timeout).
RUN_TIMEOUTS = {"async-server-mid-step-tf-config": 20}
CEILING = 240     # seconds a case may take in all on a busy machine
# Phases are lower-case words; mpirun may join two ranks' lines ("... phase traintfdist-kill ...").
MARKER = re.compile(r"tfdist-kill (rank \d+|server \d+) pid (\d+) phase ([a-z]+?)(?=tfdist-kill|\W|$)")

# name: (launcher, workers, servers, strategy arguments, victim, phase, expected message)
CASES = {
    "worker-mid-step": ("tfdist-run", 2, 0, ["--strategy", "ring"], "rank 1", "train",
                        "rank 1 exited with code 137"),
    "chief-during-save": ("tfdist-run", 2, 0, ["--strategy", "ring"], "rank 0", "save",
                          "rank 0 exited with code 137"),
    "worker-during-evaluate-tf-config": ("tf-config", 2, 0, ["--strategy", "ring"], "rank 1",
                                         "evaluate", "peer rank 1 ("),
    "server-mid-step": ("tfdist-run", 2, 1, ["--strategy", "ps"], "server 0", "train",
                        "server 0 exited with code 137"),
    "launcher-mid-step": ("tfdist-run", 2, 0, ["--strategy", "ring"], "launcher", "train", None),
    "async-server-mid-step-tf-config": ("tf-config", 2, 1, ["--strategy", "ps-async"],
                                        "server 0", "train", "parameter server 0 ("),
    # make test-all
    "worker-at-start-up": ("tfdist-run", 2, 0, ["--strategy", "ring"], "rank 1", "start",
                           "rank 1 exited with code 137"),
    "chief-mid-step-tf-config": ("tf-config", 3, 0, ["--strategy", "ring"], "rank 0", "train",
                                 "peer rank 0 ("),
    "tree-inner-node-during-evaluate": ("tfdist-run", 4, 0, ["--strategy", "tree"], "rank 1",
                                        "evaluate", "rank 1 exited with code 137"),
    "server-during-evaluate-tf-config": ("tf-config", 2, 1, ["--strategy", "ps"], "server 0",
                                         "evaluate", "parameter server 0 ("),
    "ps-worker-mid-step-tf-config": ("tf-config", 2, 1, ["--strategy", "ps"], "rank 1", "train",
                                     "stopped because worker rank 1 is gone"),
    "horovod-worker-mid-step": ("horovodrun", 2, 0, ["--backend", "horovod"], "rank 1", "train",
                                "Process 1 exit with status code 137"),
    "horovod-chief-during-save": ("horovodrun", 2, 0, ["--backend", "horovod"], "rank 0", "save",
                                  "Process 0 exit with status code 137"),
    # The cluster engines' launchers (test_launchers): each names the dead process itself.
    "mpirun-worker-mid-step": ("mpirun", 2, 0, ["--backend", "collective"], "rank 1", "train",
                               "process rank 1 with PID"),
    "srun-worker-mid-step": ("srun", 2, 0, ["--strategy", "ring"], "rank 1", "train",
                             "task 1: Killed"),
    # Ray relays the workers' output a second or more late: steps of 0.5 s.
    "ray-worker-mid-step": ("ray", 2, 0, ["--strategy", "ring", "--step-delay", "0.5"],
                            "rank 1", "train", "the Ray Train run failed"),
}
# make test: the launcher killed mid-step; a worker killed mid-step is test_elastic.py's
# SIGKILLed rank (and test_failures.py's crashed rank), a dedicated server killed mid-step is
# test_parameter_server.py's dead server; every other victim, phase and launcher in make
# test-all (Ray Train's worker too, and test_resume.py's ray-restarted).
FAST = ("launcher-mid-step",)
# The restart column: the tfdist-run cases of synchronous strategies (tfdist-run restarts).
RESTART_CASES = tuple(name for name, case in CASES.items()
                      if case[0] == "tfdist-run" and case[4] != "launcher"
                      and "ps-async" not in case[3])


class Job:
    """The processes of one case and their merged output, read line by line."""

    def __init__(self, launcher, workers, servers, args, run_timeout=RUN_TIMEOUT,
                 extra_launcher=None):
        self.output = []
        if launcher == "tf-config":
            procs, self.workers, self.servers = tf_config_job(
                list(range(workers)), workers, args, run_timeout, num_servers=servers)
            self.processes = list(procs.values())
            self.streams = list(procs.values())
        else:
            extra = (["--num-servers", str(servers)] if servers else []) + (extra_launcher or [])
            self.processes = [start_job(launcher, workers, args, run_timeout, extra)]
            self.streams = self.processes
        self.launcher_pid = self.processes[0].pid if launcher != "tf-config" else None

    def lines(self):
        """Output lines of all processes as they come (a reader thread per stream)."""
        lines = queue.Queue()

        def read(stream):
            for line in stream:
                lines.put(line)
            lines.put(None)

        for proc in self.streams:
            threading.Thread(target=read, args=(proc.stdout,), daemon=True).start()
        open_streams = len(self.streams)
        deadline = time.monotonic() + CEILING
        while open_streams and time.monotonic() < deadline:
            try:
                line = lines.get(timeout=1.0)
            except queue.Empty:
                continue
            if line is None:
                open_streams -= 1
                continue
            self.output.append(line)
            yield line

    def wait(self):
        deadline = time.monotonic() + CEILING
        for proc in self.processes:
            try:
                proc.wait(max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        return [proc.returncode for proc in self.processes]

    def kill_all(self):
        for proc in self.processes:
            if proc.poll() is None:
                proc.kill()


def survivors(tag, ceiling=60.0):
    """Command lines of this case's processes still running once `ceiling` seconds passed."""
    deadline = time.monotonic() + ceiling
    while True:
        found = subprocess.run(["pgrep", "-af", tag], capture_output=True, text=True).stdout
        found = [line for line in found.splitlines() if "pgrep" not in line]
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.2)


def kill_when_reached(job, victim, phase):
    """SIGKILL `victim` (or the launcher) when it (a server or the launcher: rank 0) announces
    `phase`; returns the pid killed (None: never reached)."""
    pids, killed = {}, None
    trigger = "rank 0" if victim == "launcher" or victim.startswith("server") else victim
    for line in job.lines():
        for match in MARKER.finditer(line):
            who, pid, reached = match.group(1), int(match.group(2)), match.group(3)
            pids[who] = pid
            if killed is None and who == trigger and reached == phase:
                killed = job.launcher_pid if victim == "launcher" else pids[victim]
                os.kill(killed, signal.SIGKILL)
    return killed


def kill_and_wait(job, victim, phase):
    """Kill `victim` at `phase` (it must get there), wait for the job: (exit codes, output)."""
    try:
        killed = kill_when_reached(job, victim, phase)
        codes = job.wait()
    finally:
        job.kill_all()
    output = "".join(job.output)
    assert killed is not None, f"{victim} never reached {phase}:\n{output[-3000:]}"
    return codes, output


@pytest.mark.parametrize("case", case_parameters(CASES, FAST,
                                                  lambda name: CASES[name][0] in (
                                                      "horovodrun", "mpirun", "srun")))
def test_sigkill_fails_the_job_cleanly(tmp_path, case):
    launcher, workers, servers, strategy_args, victim, phase, message = CASES[case]
    if launcher in ("mpirun", "srun"):
        require_launcher(launcher)
    args = [script("kill_target.py"), str(tmp_path)] + strategy_args
    job = Job(launcher, workers, servers, args, RUN_TIMEOUTS.get(case, RUN_TIMEOUT))
    codes, output = kill_and_wait(job, victim, phase)
    assert all(code not in (0, None) for code in codes), (codes, output[-3000:])
    assert not re.search(r"(rank|server) \d+ finished", output), output[-3000:]
    if message:
        assert message in output, output[-4000:]
    assert not survivors(str(tmp_path)), f"left behind: {survivors(str(tmp_path), 0)}"
    if launcher == "ray":  # the local Ray cluster the job started (its workers, raylet, GCS)
        ray_processes = r"ray::|/raylet/raylet|/gcs/gcs_server"
        assert not survivors(ray_processes), f"left behind: {survivors(ray_processes, 0)}"
    checkpoint = tmp_path / "ckpt.keras"
    if checkpoint.exists():
        keras.saving.load_model(checkpoint, compile=False)  # a torn file fails to load


@pytest.fixture(scope="module")
def never_killed(tmp_path_factory):
    """The plain script (no tfdist) with the restart column's options, run once: its weights."""
    directory = tmp_path_factory.mktemp("plain")
    subprocess.run([sys.executable, script("kill_target.py"), str(directory), "--strategy",
                    "plain", "--backup", "--step-delay", "0"], check=True, timeout=300,
                   capture_output=True)
    with np.load(directory / "weights.rank0.npz") as weights:
        return [weights[key] for key in sorted(weights.files, key=lambda k: int(k.split("_")[1]))]


@pytest.mark.slow
@pytest.mark.parametrize("case", RESTART_CASES)
def test_sigkill_under_max_restarts_resumes_like_the_run_never_killed(tmp_path, case,
                                                                      never_killed):
    _, workers, servers, strategy_args, victim, phase, message = CASES[case]
    args = [script("kill_target.py"), str(tmp_path), "--backup"] + strategy_args
    job = Job("tfdist-run", workers, servers, args, RUN_TIMEOUT,
              extra_launcher=["--max-restarts", "1"])
    codes, output = kill_and_wait(job, victim, phase)
    assert codes == [0], (codes, output[-3000:])
    assert message in output and "restarting the job (1 of 1 restarts)" in output, output[-4000:]
    # Killed before the first backup, or after fit deleted it (evaluate): from the beginning.
    expected = "no backup in" if phase in ("start", "evaluate") else "resuming from the backup"
    assert expected in output, output[-4000:]
    assert not survivors(str(tmp_path)), f"left behind: {survivors(str(tmp_path), 0)}"
    for rank in range(workers):
        with np.load(tmp_path / f"weights.rank{rank}.npz") as weights:
            final = [weights[key] for key in sorted(weights.files,
                                                    key=lambda k: int(k.split("_")[1]))]
        for mine, reference in zip(final, never_killed):
            np.testing.assert_allclose(mine, reference, atol=1e-4, rtol=0)
