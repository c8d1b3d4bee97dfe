"""A job killed or preempted mid-epoch resumes at the next batch, like it never stopped.

The worker script (tests/scripts/resume_mid_epoch.py) is a shuffled fit
under the user's unchanged `BackupAndRestore(dir, save_freq=5)`; rank 1 is
SIGKILLed after optimizer step 23 (three steps after the last backup, in
the second epoch). The job fails with a message naming the dead rank and
leaves no process behind; then either `tfdist-run --max-restarts 1`
restarts it by itself, or the same command is run again by hand (at the
same or another number of processes). A SIGTERM to rank 1 instead (a
preemption notice) makes every rank back up at the next step and exit with
42; rerun at 2 processes, it resumes right there. Either way it ends with the weights
(1e-4), the post-resume history and the early stop of the plain script run
once, never stopped - also when only the chief can see the backup (no
shared filesystem), when the input is a tf.data pipeline shuffled by
TensorFlow's global seed, and under Ray Train, which restarts its workers
itself (`FailureConfig(max_failures=1)`), and under Slurm, which requeues
the job and runs it again (`make test-all`). test_resume_in_process.py has
more cases as simulated ranks.
"""

import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from helpers import (case_parameters, failure_report, horovodrun, require_launcher, script,
                     start_job, tfdist_run)
from test_resume_in_process import STOP_AT_STEP, assert_resumed_like, resume_mid_epoch
from tfdist.fault_tolerance.preemption import PREEMPTED_EXIT_CODE

RUN_TIMEOUT = 60

CONFIGURATIONS = {
    # name: (launcher kind, signal to rank 1, processes when signalled, processes when rerun
    #        by hand (None: the launcher restarts it), input, script arguments, launcher
    #        arguments)
    "ring-restarted": ("tfdist-run", signal.SIGKILL, 3, None, "numpy", ["--strategy", "ring"],
                       ["--max-restarts", "1"]),
    "ps-dedicated-2-to-3": ("tfdist-run", signal.SIGKILL, 2, 3, "numpy", ["--strategy", "ps"],
                            ["--num-servers", "1"]),
    # A preemption notice to one rank: every rank backs up at the next step and exits with 42.
    # Only the chief's backup directory has files (as without a shared filesystem): it
    # restores and the others follow it; the input is shuffled by TensorFlow's global seed.
    "sigterm-no-shared-filesystem-3-to-2": ("tfdist-run", signal.SIGTERM, 3, 2,
                                            "tfdata-unseeded", ["--strategy", "tree",
                                                                "--backup-per-rank"], None),
    # Ray Train restarts every worker (FailureConfig(max_failures=1)); TF_CONFIG on new ports.
    # Ray relays output a second or more late: the ranks pause longer after the stop step.
    "ray-restarted": ("ray", signal.SIGKILL, 2, None, "numpy",
                      ["--strategy", "ring", "--pause-after", f"{STOP_AT_STEP}:3"],
                      ["--max-failures", "1"]),
    # A SIGTERM to the launcher reaches every worker (the servers are stopped after them): the
    # same backup, exit 42, and no restart (the launcher itself was told to stop).
    "sigterm-to-the-launcher-ps": ("tfdist-run", "launcher", 2, 2, "numpy", ["--strategy", "ps"],
                                   ["--num-servers", "1", "--max-restarts", "1"]),
    "no-shared-filesystem-killed": ("tfdist-run", signal.SIGKILL, 3, 3, "numpy",
                                    ["--strategy", "ring", "--backup-per-rank"], None),
    "tree-restarted": ("tfdist-run", signal.SIGKILL, 3, None, "numpy", ["--strategy", "tree"],
                       ["--max-restarts", "1"]),
    "ring-horovod": ("horovodrun", signal.SIGKILL, 2, 2, "numpy",
                     ["--strategy", "ring", "--backend", "horovod"], None),
}
# make test: tfdist-run's kill, restart at fewer processes and a planned resize (the notice
# path, another size, the backup on the chief only, unseeded tf.data) are test_elastic.py's
# job; every case here (Ray Train's restart among them: a minute, most of it Ray's start) in
# make test-all.
FAST = ()
RESTARTS = ("--max-restarts", "--max-failures")
RESUMED_AT = re.compile(r"resuming from the backup in \S+: epoch (\d+) after (\d+) of its steps")


def run_to_completion(kind, world, args, launcher):
    if kind == "horovodrun":
        return horovodrun(world, args, timeout=600, run_timeout=RUN_TIMEOUT)
    return tfdist_run(world, args, timeout=600, run_timeout=RUN_TIMEOUT, launcher=launcher)


def signal_rank_1_after_the_stop_step(kind, world, args, launcher, signum):
    """Run the job, send rank 1 `signum` (or the launcher SIGTERM: `signum` "launcher") once
    it has taken step STOP_AT_STEP (in the job's first run only); return (exit code, output)."""
    if "--pause-after" not in args:  # the test signals rank 1 while it pauses after the step
        args = args + ["--pause-after", f"{STOP_AT_STEP}:0.5"]
    job = start_job(kind, world, args + ["--announce"], run_timeout=RUN_TIMEOUT,
                    launcher=launcher)
    seen, killed = [], False
    try:
        marker = re.compile(rf"rank 1 pid (\d+) step {STOP_AT_STEP}\b")
        for line in job.stdout:
            seen.append(line)
            match = marker.search(line)
            if match and not killed:
                if signum == "launcher":
                    os.kill(job.pid, signal.SIGTERM)
                else:
                    os.kill(int(match.group(1)), signum)
                killed = True
                if signum == "launcher" or not set(RESTARTS) & set(launcher or []):
                    break
        rest, _ = job.communicate(timeout=300)  # bounded by the job's own timeout
        seen.append(rest)
    finally:
        job.kill()
    assert killed, "".join(seen)[-3000:]
    return job.returncode, "".join(seen)


def load(prefix, world):
    return [dict(np.load(f"{prefix}.rank{rank}.npz")) for rank in range(world)]


@pytest.fixture(scope="module")
def plain_runs(tmp_path_factory):
    """The plain script (no tfdist), never stopped, for each input: {input: its arrays}. Run
    in this process: it launches nothing."""
    directory = tmp_path_factory.mktemp("plain")
    return {inputs: resume_mid_epoch.train(str(directory / inputs), str(directory / "backup"),
                                           "plain", inputs)
            for inputs in ("numpy", "tfdata-unseeded")}


@pytest.mark.parametrize("name", case_parameters(
    CONFIGURATIONS, FAST, lambda name: CONFIGURATIONS[name][0] == "horovodrun"))
def test_killed_job_resumes_at_the_next_batch_like_an_uninterrupted_run(tmp_path, name,
                                                                         plain_runs):
    kind, signum, world, rerun_world, inputs, strategy_args, launcher = CONFIGURATIONS[name]
    resumed = str(tmp_path / "resumed")
    command = [script("resume_mid_epoch.py"), resumed, str(tmp_path / "backup"),
               "--input", inputs] + strategy_args
    code, output = signal_rank_1_after_the_stop_step(kind, world, command, launcher, signum)
    notice = signum in (signal.SIGTERM, "launcher")
    if notice:  # every rank backed up at one step and exited with 42
        assert code == PREEMPTED_EXIT_CODE, output[-4000:]
        assert "tfdist: preempted: backed up" in output, output[-4000:]
        assert all(f"rank {rank} received SIGTERM" in output
                   for rank in ([1] if signum == signal.SIGTERM else range(world))), \
            output[-4000:]
        assert "restarting the job" not in output, output[-4000:]
    else:
        assert "rank 1" in output and ("exited" in output or "died" in output), output[-3000:]
    if rerun_world is None and not notice:  # the launcher (or Ray) restarted the job by itself
        assert code == 0, output[-4000:]
        assert kind != "tfdist-run" or "restarting the job (1 of 1 restarts)" in output, \
            output[-4000:]
        assert kind != "ray" or "launched by TF_CONFIG" in output, output[-4000:]
        rerun_world = world
    else:
        assert code != 0, output[-3000:]
        assert "rank 0 finished" not in output, output[-3000:]
        done = run_to_completion(kind, rerun_world, command, launcher)  # the command again
        assert done.returncode == 0, failure_report(done)
        output = done.stdout + done.stderr
    resumed_at = RESUMED_AT.search(output)
    assert resumed_at, output[-3000:]
    epoch, steps_done = int(resumed_at.group(1)) - 1, int(resumed_at.group(2))
    # A kill loses the steps after the last backup (every 5 steps); a notice none: it arrives
    # while the ranks pause after step 23, and the next step carries it.
    last_backup = epoch * 12 + steps_done
    assert (last_backup == STOP_AT_STEP + 1 if notice
            else last_backup % 5 == 0 and last_backup <= STOP_AT_STEP + 2), output[-3000:]
    for result in load(resumed, rerun_world):
        assert_resumed_like(plain_runs[inputs], result, epoch)


@pytest.mark.slow
def test_a_slurm_job_requeued_mid_epoch_backs_up_and_resumes_when_slurm_runs_it_again(
        tmp_path, plain_runs):
    """`sbatch --requeue` on the one-node Slurm, then `scontrol requeue` mid-epoch (what
    Slurm's preemption with PreemptMode=REQUEUE does): Slurm sends SIGTERM to every task,
    every rank backs up at the next step and exits 42, and Slurm runs the batch script again
    (its output appended), which resumes there and ends as the plain script never stopped.
    (Slurm holds a requeued job back for about two minutes; the test releases it at once.)"""
    require_launcher("srun")
    out, resumed = tmp_path / "job.out", str(tmp_path / "resumed")
    command = (f"srun {sys.executable} {script('resume_mid_epoch.py')} {resumed} "
               f"{tmp_path / 'backup'} --strategy ring --announce --pause-after "
               f"{STOP_AT_STEP}:3")
    job = subprocess.run(["sbatch", "--parsable", "--requeue", "--open-mode=append", "-o",
                          str(out), "-n", "2", "--wrap", command],
                         capture_output=True, text=True, check=True).stdout.strip()

    def output():
        return out.read_text(errors="replace") if out.exists() else ""

    def state():
        return subprocess.run(["squeue", "-h", "-j", job, "-o", "%T"], capture_output=True,
                              text=True).stdout.strip()

    def wait_for(condition, seconds):
        deadline = time.monotonic() + seconds
        while not condition() and time.monotonic() < deadline:
            time.sleep(0.2)
        return condition()

    try:
        assert wait_for(lambda: f"step {STOP_AT_STEP}\n" in output(), 120), output()[-3000:]
        subprocess.run(["scontrol", "requeue", job], check=True, timeout=30)
        assert wait_for(lambda: state() == "PENDING", 60), output()[-3000:]
        subprocess.run(["scontrol", "update", f"jobid={job}", "StartTime=now"], check=True,
                       timeout=30)
        assert wait_for(lambda: state() == "", 180), output()[-3000:]
    finally:
        subprocess.run(["scancel", job], capture_output=True, timeout=30)
    text = output()
    # srun names the tasks together or one by one, as they end
    assert ("tasks 0-1: Exited with exit code 42" in text
            or all(f"task {t}: Exited with exit code 42" in text for t in (0, 1))), text[-4000:]
    assert "tfdist: preempted: backed up" in text, text[-4000:]
    resumed_at = RESUMED_AT.search(text)
    assert resumed_at, text[-4000:]
    epoch, steps_done = int(resumed_at.group(1)) - 1, int(resumed_at.group(2))
    assert epoch * 12 + steps_done == STOP_AT_STEP + 1, text[-3000:]
    for result in load(resumed, 2):
        assert_resumed_like(plain_runs["numpy"], result, epoch)
