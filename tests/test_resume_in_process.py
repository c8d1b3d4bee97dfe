"""Mid-epoch exact resume with the user's unchanged `BackupAndRestore(dir, save_freq=5)`,
at simulated ranks (no process launched).

The worker script (tests/scripts/resume_mid_epoch.py): a shuffled fit
(Adam + CosineDecay, EarlyStopping whose patience runs out only if its
state survives, accuracy) stopped on every rank at optimizer step 23 of
36 - three steps after the last backup, in the second epoch - then run
again, at another number of ranks. The resumed run must end with the
uninterrupted plain script's weights (1e-4), the same post-resume history
and the same stop. A plain Keras run stopped and resumed the same way
restarts the epoch and ends 0.1 away, after 56 steps (docs/fault-tolerance.md). test_resume.py kills real processes.
"""

import json
import os
import signal
import sys
import time

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "scripts"))
import resume_mid_epoch  # noqa: E402  pylint: disable=wrong-import-position

from tfdist.simulation import simulate_processes  # noqa: E402  pylint: disable=wrong-import-position
from tfdist.fault_tolerance import preemption  # noqa: E402  pylint: disable=wrong-import-position
from tfdist.fault_tolerance.agreed_flags import AgreedFlags  # noqa: E402  pylint: disable=wrong-import-position
from tfdist.fault_tolerance import backup_state  # noqa: E402  pylint: disable=wrong-import-position
from tfdist.fault_tolerance.preemption import PREEMPTED_EXIT_CODE  # noqa: E402  pylint: disable=wrong-import-position

STOP_AT_STEP = 23  # the last backup: step 20, 8 steps into the second epoch
ATOL = 1e-4


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    """plain(inputs): the plain script's run never stopped (computed once per input)."""
    runs = {}

    def run_once(inputs, **options):
        key = (inputs, tuple(sorted(options.items())))
        if key not in runs:
            directory = tmp_path_factory.mktemp(f"plain-{inputs}")
            runs[key] = resume_mid_epoch.train(str(directory / "run"),
                                               str(directory / "backup"), "plain", inputs,
                                               **options)
        return runs[key]

    return run_once


def run(directory, name, world, strategy, inputs, **options):
    out = str(directory / name)
    return simulate_processes(world, lambda rank: resume_mid_epoch.train(
        out, str(directory / "backup"), strategy, inputs, **options))


def assert_resumed_like(reference, resumed, epoch=1):
    """The resumed run's weights, post-resume history and stop are the uninterrupted run's
    (resumed in `epoch`, counted from 0: the second by default)."""
    resumed_epochs = list(resumed["epochs"])
    assert resumed_epochs[0] == epoch, resumed_epochs
    assert resumed_epochs == list(reference["epochs"][epoch:]), (resumed_epochs,
                                                                 reference["epochs"])
    assert int(resumed["steps"]) == int(reference["steps"])
    for key, values in reference.items():
        if key.startswith("history/"):
            np.testing.assert_allclose(resumed[key], values[epoch:], rtol=1e-5, atol=1e-6,
                                       err_msg=key)
        elif key.startswith("w"):
            np.testing.assert_allclose(resumed[key], values, rtol=0, atol=ATOL, err_msg=key)


@pytest.mark.parametrize("inputs,stopped_world,resumed_world", [
    ("numpy", 3, 2),  # arrays shuffled by Keras; resumed by a reduction tree
    # A seeded tf.data shuffle, reshuffled each epoch (make test-all; make test resumes an
    # unseeded one in test_resume.py).
    pytest.param("tfdata", 2, 3, marks=pytest.mark.slow),
    ("pydataset", 2, 3),  # reshuffled by its own generator in on_epoch_end
])
def test_a_run_stopped_mid_epoch_resumes_at_the_next_batch_at_another_size(
        tmp_path, plain, inputs, stopped_world, resumed_world):
    reference = plain(inputs)
    stopped = run(tmp_path, "stopped", stopped_world, "ring", inputs, stop_at_step=STOP_AT_STEP)
    assert stopped == [None] * stopped_world
    resumed = run(tmp_path, "resumed", resumed_world, "tree" if inputs == "numpy" else "ring",
                  inputs)
    for rank_result in resumed:
        assert_resumed_like(reference, rank_result)
    assert not os.path.exists(tmp_path / "backup")  # deleted at the end of the finished fit


def test_a_backup_at_an_epochs_last_step_resumes_with_that_epochs_logs(tmp_path, plain):
    """Backed up every 6 steps, the backup before step 26 is at the second epoch's last step
    (24): the resumed run trains no step of that epoch, and its epoch-end logs, EarlyStopping
    and History still see the epoch's loss and metrics. Stopped at 2 ranks, resumed by one
    process."""
    reference = plain("numpy")
    run(tmp_path, "stopped", 2, "ring", "numpy", stop_at_step=26, save_freq=6)
    resumed = run(tmp_path, "resumed", 1, "ring", "numpy", save_freq=6)[0]
    assert_resumed_like(reference, resumed)


def preempted_at_3_ranks(tmp_path, options):
    """Train at 3 simulated ranks with `options(rank)` until a notice stops them: every rank
    must exit with 42; the backup's position."""

    def preempted(rank):
        try:
            resume_mid_epoch.train(str(tmp_path / "stopped"), str(tmp_path / "backup"), "ring",
                                   "numpy", **options(rank))
        except SystemExit as stop:
            return stop.code
        return "finished"

    assert simulate_processes(3, preempted) == [PREEMPTED_EXIT_CODE] * 3
    with open(tmp_path / "backup" / "training_metadata.json") as f:
        return json.load(f)["tfdist"]["position"]


def test_a_preemption_notice_to_one_rank_backs_up_every_rank_at_the_next_step(tmp_path, plain):
    """Rank 1 of 3 gets the notice after step 22, twice: the next step carries it, so every
    rank backs up after step 23 - mid-epoch, although the backup saves at epoch ends only -
    and exits with code 42; rerun at 2 ranks, the job goes on at step 24 and ends as the
    plain script never stopped."""
    reference = plain("numpy")
    position = preempted_at_3_ranks(tmp_path, lambda rank: {
        "notice_at_step": 22 if rank == 1 else None, "save_freq": "epoch"})
    assert position["iterations"] == 23 and position["steps_done"] == 11, position
    resumed = run(tmp_path, "resumed", 2, "tree", "numpy", save_freq="epoch")[0]
    assert_resumed_like(reference, resumed)


@pytest.mark.parametrize("when,backed_up_at", [
    ("to-every-rank-after-step-22", 23),
    ("to-rank-1-as-step-20-runs", 21),  # after step 20 wrote its flags: step 21 carries it
    ("to-the-chief-while-it-writes-the-step-5-backup", 6),
])
def test_a_notice_is_taken_at_the_next_step_whenever_it_arrives(tmp_path, monkeypatch, when,
                                                                 backed_up_at):
    """A notice to every rank at once, one arriving while a step's all-reduce is in flight,
    and one arriving while the chief writes a periodic backup (the write completes, the
    next step takes the notice): every rank backs up at one step, at most one after the
    notice, and exits with 42 (the resume from such a backup is the test above's)."""
    if when.endswith("backup"):
        write = backup_state.save_backup

        def write_then_notice(*args, **kwargs):
            for notice in preemption._armed_notices():  # pylint: disable=protected-access
                if notice.rank == 0:
                    notice.notice("a test's notice during the save")
            write(*args, **kwargs)

        monkeypatch.setattr(backup_state, "save_backup", write_then_notice)

    def options(rank):
        if when.startswith("to-every-rank"):
            return {"notice_at_step": 22, "save_freq": "epoch"}
        if when.startswith("to-rank-1"):
            return {"notice_at_step": 19 if rank == 1 else None, "notice_before_step": True,
                    "save_freq": "epoch"}
        return {"save_freq": 5}

    assert preempted_at_3_ranks(tmp_path, options)["iterations"] == backed_up_at


def test_early_stopping_restores_the_best_weights_of_before_the_resume(tmp_path, plain):
    """EarlyStopping(restore_best_weights=True): its best epoch is the first (min_delta=1), so
    training ends with the first epoch's weights; stopped in the second epoch at 3 ranks and
    resumed at 2, the run ends with them too (the chief wrote them beside the backup; without
    them it would end with the second epoch's)."""
    reference = plain("numpy", restore_best_weights=True)
    run(tmp_path, "stopped", 3, "ring", "numpy", stop_at_step=STOP_AT_STEP,
        restore_best_weights=True)
    assert list((tmp_path / "backup").glob("tfdist-best-weights-0.npz"))
    resumed = run(tmp_path, "resumed", 2, "tree", "numpy", restore_best_weights=True)
    for result in resumed:
        assert_resumed_like(reference, result)


def test_an_unreadable_backup_is_named_and_the_previous_one_resumes(tmp_path, plain, capsys):
    """With `double_checkpoint=True` Keras keeps the previous backup (step 15 beside step 20's):
    the latest one truncated (a disk that lost its end), the chief says so and the job
    resumes from the previous one, as exactly."""
    reference = plain("numpy")
    run(tmp_path, "stopped", 2, "ring", "numpy", stop_at_step=STOP_AT_STEP,
        double_checkpoint=True)
    latest = tmp_path / "backup" / "latest.weights.h5"
    latest.write_bytes(latest.read_bytes()[:1000])
    resumed = run(tmp_path, "resumed", 2, "ring", "numpy", double_checkpoint=True)[0]
    output = capsys.readouterr().out
    assert "cannot be read" in output and "resuming from the previous one" in output, output
    assert "epoch 2 after 3 of its steps (optimizer step 15)" in output, output
    assert_resumed_like(reference, resumed)


def test_dropout_masks_continue_where_the_backup_left_them(tmp_path):
    """Seed-generator state is not in Keras' weights file; the backup has it. (Dropout masks
    depend on the number of ranks, so the reference is the same 2 ranks, never stopped.)"""
    reference = run(tmp_path / "straight", "straight", 2, "ring", "numpy", dropout=True)[0]
    run(tmp_path, "stopped", 2, "ring", "numpy", dropout=True, stop_at_step=STOP_AT_STEP)
    resumed = run(tmp_path, "resumed", 2, "ring", "numpy", dropout=True)[0]
    assert_resumed_like(reference, resumed)


def deliver(signum, until, seconds=5.0):
    """Send this process `signum`; return once `until()` (Python runs handlers in the main
    thread between bytecodes, not always before `os.kill` returns)."""
    os.kill(os.getpid(), signum)
    deadline = time.monotonic() + seconds
    while not until() and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.05)


def test_the_signal_gives_the_notice_only_while_a_fit_is_armed(monkeypatch):
    """While armed, the preemption signal only raises the flag; disarmed, tfdist's handler is
    gone and the signal reaches the handler the process had (here a test's own). A pending
    notice at the end of the fit is handed to that handler; a bad signal name is refused."""
    monkeypatch.setenv(preemption.ENV_PREEMPTION_SIGNAL, "SIGUSR1")
    received = []
    previous = signal.signal(signal.SIGUSR1, lambda signum, frame: received.append(signum))
    try:
        flags = AgreedFlags(world_size=1)
        notice = preemption.PreemptionNotice(flags, rank=0, timeout=60)
        notice.arm()
        deliver(signal.SIGUSR1, lambda: notice.noticed)
        deliver(signal.SIGUSR1, lambda: True)  # a second signal changes nothing
        assert notice.noticed and notice.agreed() and received == []
        notice.disarm()  # the fit ended before a step took it: as the signal would have
        assert received == [signal.SIGUSR1] and not notice.agreed()
        deliver(signal.SIGUSR1, lambda: len(received) == 2)
        assert received == [signal.SIGUSR1] * 2
        monkeypatch.setenv(preemption.ENV_PREEMPTION_SIGNAL, "SIGNOPE")
        with pytest.raises(ValueError, match="must name a signal"):
            notice.arm()
    finally:
        signal.signal(signal.SIGUSR1, previous)
