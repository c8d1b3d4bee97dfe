"""An elastic tfdist-run job loses a process, shrinks, gets capacity back, grows, and ends with
the weights, history and early stop of the plain script never stopped.

`tfdist-run -np 3 --min-np 2 --host-discovery-script "cat SLOTS"` runs
tests/scripts/resume_mid_epoch.py (the user's unchanged
`BackupAndRestore(save_freq=5)`, a fit on a tf.data pipeline shuffled by
TensorFlow's global seed only, that `EarlyStopping` ends after its third
epoch; 12 steps per epoch of a global batch of 32; the backup directory
has files on the chief only, as without a shared filesystem):

1. at 3 processes, after optimizer step 23, the discovery script loses a
   slot and rank 1 is SIGKILLed: the job goes on with 2 processes from the
   backup at step 20 (3 steps redone);
2. at 2 processes, paused after step 23 again, the slot comes back: every
   rank backs up after the next step (24, nothing redone) and the job
   starts again at 3 processes;
3. the last run's weights (1e-4), post-resume history and stop equal the
   plain script's, run in this process, never stopped.

The decisions are checked in-process in test_elastic_membership.py, the
launcher's loop with probe ranks in test_launcher.py. make test-all also runs
Horovod's elastic Keras example's structure (`hvd.elastic.run`, `KerasState`,
the state callbacks; tests/scripts/horovod_elastic.py) grown and shrunk under
an elastic tfdist-run, and Ray Train's elastic `ScalingConfig(num_workers=(min,
max))` on Ray's local cluster losing a node and getting one back.
"""

import os
import re
import signal

import numpy as np
import pytest

from helpers import failure_report, script, start_job
from test_resume_in_process import STOP_AT_STEP, assert_resumed_like, resume_mid_epoch

RUN_TIMEOUT = 60
RESUMED_AT = re.compile(r"resuming from the backup in \S+: epoch (\d+) after (\d+) of its steps")
PAUSED = re.compile(rf"rank 1 pid (\d+) step {STOP_AT_STEP}\b")


@pytest.fixture(scope="module")
def plain_run(tmp_path_factory):
    directory = tmp_path_factory.mktemp("plain")
    return resume_mid_epoch.train(str(directory / "plain"), str(directory / "backup"), "plain",
                                  "tfdata-unseeded")


# sharding="parameters": each rank's backup holds its slices, resharded at 2 and at 3 (make
# test-all; the in-process tier resumes a stage-3 backup of 3 ranks at 2).
@pytest.mark.parametrize("strategy", ["ring", pytest.param("parameters", marks=pytest.mark.slow)])
def test_a_killed_rank_shrinks_the_job_returned_capacity_grows_it_and_it_ends_exactly(
        tmp_path, plain_run, strategy):
    slots = tmp_path / "slots"
    slots.write_text("localhost:3\n")
    out = str(tmp_path / "resumed")
    job = start_job("tfdist-run", 3,
                    [script("resume_mid_epoch.py"), out, str(tmp_path / "backup"),
                     "--strategy", strategy, "--input", "tfdata-unseeded", "--backup-per-rank",
                     "--announce", "--pause-after", f"{STOP_AT_STEP}:4"],
                    run_timeout=RUN_TIMEOUT,
                    launcher=["--min-np", "2", "--host-discovery-script", f"cat {slots}",
                              "--elastic-timeout", "120"])
    seen, pauses = [], 0
    try:
        for line in job.stdout:
            seen.append(line)
            match = PAUSED.search(line)
            if not match:
                continue
            pauses += 1
            if pauses == 1:  # a machine is lost: its slot disappears, its process dies
                slots.write_text("localhost:2\n")
                os.kill(int(match.group(1)), signal.SIGKILL)
            elif pauses == 2:  # capacity comes back while the 2 ranks pause after step 23
                slots.write_text("localhost:3\n")
        rest, _ = job.communicate(timeout=300)
        seen.append(rest)
    finally:
        job.kill()
    output = "".join(seen)
    done = type("Done", (), {"stdout": output, "stderr": ""})
    assert job.returncode == 0, failure_report(done)
    assert pauses == 2, output[-4000:]
    shrink = re.search(r"tfdist-run: resizing from 3 to 2 processes: rank 1 exited with code "
                       r"137; the ranks resume from the backup at epoch 2 after (\d+) of its "
                       r"steps \(optimizer step (\d+), written by 3 process\(es\)\)", output)
    assert shrink, output[-4000:]
    assert int(shrink.group(2)) % 5 == 0 and int(shrink.group(2)) <= STOP_AT_STEP
    grow = re.search(r"tfdist-run: resizing from 2 to 3 processes: the discovery script reports "
                     r"3 slot\(s\) instead of 2; the ranks resume from the backup at epoch \d+ "
                     r"after \d+ of its steps \(optimizer step (\d+), written by 2 process",
                     output)
    assert grow and int(grow.group(1)) == STOP_AT_STEP + 1, output[-4000:]  # nothing redone
    assert "received tfdist-run's request to resize from 2 to 3 processes" in output
    resumed = RESUMED_AT.findall(output)
    assert len(resumed) == 2, resumed
    epoch = int(resumed[-1][0]) - 1
    for rank in range(3):
        assert_resumed_like(plain_run, dict(np.load(f"{out}.rank{rank}.npz")), epoch)


ANNOUNCED = re.compile(r"rank (\d+) pid (\d+) world (\d+) epoch (\d+) batch (\d+)")


@pytest.mark.slow  # make test-all
@pytest.mark.horovod
def test_horovods_elastic_keras_example_grows_and_shrinks_under_elastic_tfdist_run(tmp_path):
    """Horovod's elastic Keras example's structure (tests/scripts/horovod_elastic.py: KerasState,
    the three state callbacks, `@hvd.elastic.run`), import changed: slots 2 -> 3 grows the job
    at a commit, a killed rank shrinks it back to 2 from the last commit, and the job finishes
    its epochs counted over its runs."""
    slots = tmp_path / "slots"
    slots.write_text("localhost:2\n")
    out = str(tmp_path / "hvd")
    job = start_job("tfdist-run", 2, [script("horovod_elastic.py"), out, "--pause-at", "1:2:4"],
                    run_timeout=RUN_TIMEOUT,
                    launcher=["--min-np", "1", "--max-np", "3", "--host-discovery-script",
                              f"cat {slots}"])
    seen, pids, acted = [], {}, 0
    try:
        for line in job.stdout:
            seen.append(line)
            match = ANNOUNCED.search(line)
            if not match:
                continue
            rank, pid, world, epoch, batch = (int(g) for g in match.groups())
            pids[(world, rank)] = pid
            if (epoch, batch) != (1, 2) or rank != 0:
                continue
            if world == 2 and acted == 0:
                slots.write_text("localhost:3\n")  # capacity comes
                acted = 1
            elif world == 3 and acted == 1:
                os.kill(pids[(3, 2)], signal.SIGKILL)  # a process is lost
                acted = 2
        rest, _ = job.communicate(timeout=300)
        seen.append(rest)
    finally:
        job.kill()
    output = "".join(seen)
    assert job.returncode == 0, output[-4000:]
    assert acted == 2, output[-4000:]
    assert ("resizing from 2 to 3 processes: the discovery script reports 3 slot(s) instead of 2; "
            "the ranks resume from the state hvd.elastic committed last (batch ") in output
    assert "resizing from 3 to 2 processes: rank 2 exited with code 137" in output
    assert "the job's processes change: the state is committed" in output
    assert output.count("resumed from the job's last commit at {'batch'") == 2, output[-4000:]
    import json  # pylint: disable=import-outside-toplevel
    with open(out + ".json") as f:
        final = json.load(f)
    assert final["epoch"] == 4 and final["world"] == 2 and final["restart"] == 2, final


STEP_MARK = re.compile(rf"rank (\d+) pid (\d+) step {STOP_AT_STEP}\b")


@pytest.mark.slow  # make test-all
def test_ray_trains_elastic_scaling_config_loses_a_node_gets_one_back_and_ends_exactly(
        tmp_path, plain_run_numpy):
    """Ray Train's `ScalingConfig(num_workers=(1, 3))` on Ray's local cluster of one-CPU nodes
    (tests/scripts/ray_train_job.py --elastic): a node is removed (its worker dies: Ray restarts
    the group with 1 worker, which resumes from the backup), a node is added (Ray resizes the
    group to 2 at its next look: the workers stop where they are and resume from the backup),
    and the job ends with the plain script's weights, history and stop. The ranks pause 30 s
    after step 23: Ray sees a new node at its coordinator's next tick (every 20 s) and first
    retries the old size on a removed node's stale resources (the start timeout, 30 s here)."""
    control = tmp_path / "control"
    control.mkdir()
    out = str(tmp_path / "resumed")
    job = start_job("ray", 2,
                    [script("resume_mid_epoch.py"), out, str(tmp_path / "backup"),
                     "--strategy", "ring", "--announce", "--pause-after", f"{STOP_AT_STEP}:30"],
                    run_timeout=RUN_TIMEOUT,
                    launcher=["--max-failures", "2", "--elastic", "1", "3", str(control)])
    seen, acted = [], 0
    try:
        for line in job.stdout:
            seen.append(line)
            match = STEP_MARK.search(line)
            if not match:
                continue
            if acted == 0 and match.group(1) == "1":
                (control / "remove").touch()  # a node (and the worker on it) is lost
                acted = 1
            elif acted == 1 and match.group(1) == "0" and "resuming from the backup" in "".join(
                    seen):
                (control / "add").touch()  # capacity comes back
                acted = 2
        rest, _ = job.communicate(timeout=600)
        seen.append(rest)
    finally:
        job.kill()
    output = "".join(seen)
    assert job.returncode == 0, output[-5000:]
    assert acted == 2, output[-5000:]
    resumed = RESUMED_AT.findall(output)
    assert len(resumed) >= 2, output[-5000:]
    assert "written by 2 process(es)" in output or "written by 1 process(es)" in output
    epoch = int(resumed[-1][0]) - 1
    finals = sorted(f for f in os.listdir(tmp_path) if f.startswith("resumed.rank"))
    assert finals == ["resumed.rank0.npz", "resumed.rank1.npz"], (finals, output[-3000:])
    for name in finals:
        assert_resumed_like(plain_run_numpy, dict(np.load(tmp_path / name)), epoch)


@pytest.fixture(scope="module")
def plain_run_numpy(tmp_path_factory):
    directory = tmp_path_factory.mktemp("plain_numpy")
    return resume_mid_epoch.train(str(directory / "plain"), str(directory / "backup"), "plain",
                                  "numpy")
