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
launcher's loop with probe ranks in test_launcher.py.
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


def test_a_killed_rank_shrinks_the_job_returned_capacity_grows_it_and_it_ends_exactly(
        tmp_path, plain_run):
    slots = tmp_path / "slots"
    slots.write_text("localhost:3\n")
    out = str(tmp_path / "resumed")
    job = start_job("tfdist-run", 3,
                    [script("resume_mid_epoch.py"), out, str(tmp_path / "backup"),
                     "--strategy", "ring", "--input", "tfdata-unseeded", "--backup-per-rank",
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
