"""A job killed mid-training and rerun with the same command resumes like it never stopped.

Every synchronous strategy: a SIGKILL of one worker mid-epoch fails the whole
job with a message naming the dead rank, leaves no process behind, and the
same command run again resumes from `BackupAndRestore`'s last backup and
finishes with the weights of an uninterrupted run - also when only the chief
can see the backup (no shared filesystem). The uninterrupted run is one
process, launched once for every configuration: any number of processes
trains as one does (test_equivalence), so it is each configuration's too.
"""

import os
import re
import signal

import numpy as np
import pytest

from helpers import case_parameters, failure_report, horovodrun, script, start_job, tfdist_run

RUN_TIMEOUT = 60
EPOCHS, KILLED_IN_EPOCH = 5, 2

CONFIGURATIONS = {
    # name: (launcher kind, processes, script arguments, launcher arguments)
    "ring-collective": ("tfdist-run", 2, ["--strategy", "ring"], None),
    "ps-dedicated": ("tfdist-run", 2, ["--strategy", "ps"], ["--num-servers", "1"]),
    "tree": ("tfdist-run", 3, ["--strategy", "tree"], None),
    "ring-horovod": ("horovodrun", 2, ["--strategy", "ring", "--backend", "horovod"], None),
    # Only the chief's backup directory has files: it restores and the others follow it.
    "no-shared-filesystem": ("tfdist-run", 3, ["--strategy", "ring", "--no-shared-filesystem"],
                             None),
}
FAST = ("ring-collective", "ps-dedicated", "no-shared-filesystem")


def run_to_completion(kind, world, args, launcher):
    if kind == "horovodrun":
        return horovodrun(world, args, timeout=600, run_timeout=RUN_TIMEOUT)
    return tfdist_run(world, args, timeout=600, run_timeout=RUN_TIMEOUT, launcher=launcher)


def kill_rank_mid_epoch(kind, world, args, launcher, victim):
    """Start the job, SIGKILL rank `victim` once epoch KILLED_IN_EPOCH starts; return its output."""
    job = start_job(kind, world, args, run_timeout=RUN_TIMEOUT, launcher=launcher)
    seen = []
    try:
        marker = re.compile(rf"rank {victim} pid (\d+) epoch {KILLED_IN_EPOCH}\b")
        for line in job.stdout:
            seen.append(line)
            match = marker.search(line)
            if match:
                os.kill(int(match.group(1)), signal.SIGKILL)
                break
        rest, _ = job.communicate(timeout=300)  # bounded by the job's own timeout
        seen.append(rest)
    finally:
        job.kill()
    return job.returncode, "".join(seen)


def load(prefix, world):
    return [dict(np.load(f"{prefix}.rank{rank}.npz")) for rank in range(world)]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """The job run to completion by one process, never stopped: rank 0's arrays."""
    directory = tmp_path_factory.mktemp("uninterrupted")
    prefix = str(directory / "run")
    done = run_to_completion("tfdist-run", 1, [script("resume_job.py"), prefix,
                                               str(directory / "backup")], None)
    assert done.returncode == 0, failure_report(done)
    return load(prefix, 1)[0]


@pytest.mark.parametrize("name", case_parameters(
    CONFIGURATIONS, FAST, lambda name: CONFIGURATIONS[name][0] == "horovodrun"))
def test_killed_job_rerun_resumes_like_an_uninterrupted_run(tmp_path, name, uninterrupted):
    kind, world, strategy_args, launcher = CONFIGURATIONS[name]
    resumed = str(tmp_path / "resumed")
    command = [script("resume_job.py"), resumed, str(tmp_path / "backup")] + strategy_args
    code, output = kill_rank_mid_epoch(kind, world, command, launcher, victim=1)
    assert code != 0, output[-3000:]
    assert "rank 1" in output and ("exited" in output or "died" in output), output[-3000:]
    assert "rank 0 finished" not in output, output[-3000:]

    done = run_to_completion(kind, world, command, launcher)  # the same command again
    assert done.returncode == 0, failure_report(done)
    expected = uninterrupted
    for rank, result in enumerate(load(resumed, world)):
        # Resumed after the last complete epoch before the kill.
        assert int(result["epochs_run"]) == EPOCHS - KILLED_IN_EPOCH, (rank, result["epochs_run"])
        np.testing.assert_allclose(result["losses"], expected["losses"][KILLED_IN_EPOCH:],
                                   rtol=1e-5, atol=1e-6)
        for key in expected:
            if key.startswith("arr_"):
                np.testing.assert_allclose(result[key], expected[key], rtol=0, atol=1e-4,
                                           err_msg=f"rank {rank} {key}")
