"""An elastic job's decisions, in-process: the membership rules, Horovod's discovery format,
tfdist-run's elastic flags, and the launcher's loop against a simulated discovery and
simulated runs (no process is started: `run_job` is a script of outcomes).

The launched counterparts: test_launcher.py (tfdist-run with probe ranks: kill, shrink, grow,
wait, give up) and test_elastic.py (a real fit killed, shrunk and grown, against the plain
script).
"""

import json
import os
import tempfile
import types

import pytest

from tfdist.fault_tolerance import elastic_channel
from tfdist.fault_tolerance.membership import GIVE_UP, RESIZE, RUN, WAIT, Membership
from tfdist.launch import cli, elastic_job, host_discovery


# ------------------------------------------------------------------------ the rules
def test_a_job_starts_at_np_fewer_when_fewer_slots_and_waits_below_min_np():
    decision = Membership(3, 2, 4, discovers=True).start(5)
    assert (decision.action, decision.size) == (RUN, 3)  # -np, not the 5 slots
    decision = Membership(3, 2, 4, discovers=True).start(2)
    assert (decision.action, decision.size) == (RUN, 2)
    assert "reports 2 slot(s)" in decision.why
    decision = Membership(3, 2, 4, discovers=True).start(1)
    assert (decision.action, decision.size) == (WAIT, 1)
    assert "--min-np 2" in decision.why


def test_a_lost_process_shrinks_the_job_and_a_changed_report_grows_it_back():
    members = Membership(3, 2, 4, discovers=True)
    members.started(members.start(3).size)
    assert members.discovered(3) is None  # unchanged
    decision = members.lost(1, "rank 1 exited with code 137", 3)
    assert (decision.action, decision.size, decision.why) == (
        RUN, 2, "rank 1 exited with code 137")
    members.started(2)
    assert members.discovered(3) is None  # the same report: no growth back
    assert members.discovered(2) is None  # capacity taken away: already 2
    decision = members.discovered(3)  # capacity given back
    assert (decision.action, decision.size) == (RESIZE, 3)
    assert decision.why == "the discovery script reports 3 slot(s) instead of 2"
    members.stopped()
    assert members.next_run(None, decision.why).size == 3
    members.started(3)
    decision = members.discovered(9)  # capped at --max-np
    assert (decision.action, decision.size) == (RESIZE, 4)


def test_a_report_that_saw_the_loss_first_is_not_counted_twice():
    members = Membership(3, 2, 3, discovers=True)
    members.started(members.start(3).size)
    assert members.discovered(2).size == 2  # the discovery drops the dead slot first
    decision = members.lost(1, "rank 2 exited with code 137", 3)
    assert (decision.action, decision.size) == (RUN, 2)


def test_below_min_np_the_job_waits_for_slots_or_gives_up_without_a_discovery_script():
    members = Membership(2, 2, 2, discovers=True)
    members.started(members.start(2).size)
    assert members.lost(1, "rank 0 exited with code 1", 2).action == WAIT
    assert members.next_run(1, "x").action == WAIT
    assert members.next_run(2, "x").size == 2
    fixed = Membership(2, 1, 2, discovers=False)
    fixed.started(fixed.start(2).size)
    assert fixed.lost(1, "rank 1 exited with code 9", 2).size == 1
    fixed.started(1)
    decision = fixed.lost(1, "rank 0 exited with code 9", 1)
    assert decision.action == GIVE_UP and "no --host-discovery-script" in decision.why


def test_the_limits_are_checked():
    for num_proc, min_np, max_np in ((2, 3, 4), (3, 2, 2), (2, 0, 2)):
        with pytest.raises(ValueError, match="--min-np"):
            Membership(num_proc, min_np, max_np, discovers=True)


# ----------------------------------------------------------- Horovod's discovery format
def test_the_discovery_output_is_read_as_horovod_reads_it(tmp_path):
    assert host_discovery.parse("localhost:2\nnode-b\n\n", 3) == {"localhost": 2, "node-b": 3}
    assert host_discovery.parse("", 1) == {}
    for bad in ("localhost:two", "localhost:-1", ":4"):
        with pytest.raises(ValueError, match="hostname:slots"):
            host_discovery.parse(bad, 1)
    slots_file = tmp_path / "slots"
    slots_file.write_text("localhost:2\n127.0.0.1:1\n")
    said = []
    script = host_discovery.DiscoveryScript(f"cat {slots_file}", 1, log=said.append)
    assert script.slots() == 3 and said == []
    slots_file.write_text("localhost:2\nsome-other-host:2\n")
    assert script.slots() == 2  # another machine's slots are refused, by name, once
    assert len(said) == 1 and "some-other-host" in said[0] and "not this machine" in said[0]
    script.slots()
    assert len(said) == 1  # said once
    slots_file.write_text("some-other-host:2\n")  # a first discovery of other machines only
    with pytest.raises(RuntimeError, match="lists only other machines .some-other-host."):
        host_discovery.DiscoveryScript(f"cat {slots_file}", 1).slots()
    with pytest.raises(RuntimeError, match="exited with code 3"):
        host_discovery.DiscoveryScript("echo broken >&2; exit 3", 1).slots()
    slots_file.write_text("localhost:x\n")
    with pytest.raises(RuntimeError, match="hostname:slots"):
        script.slots()


# ------------------------------------------------------------------ tfdist-run's flags
@pytest.mark.parametrize("flags,message", [
    (["-np", "2", "--min-np", "3"], "--min-np (3) must be <= -np (2)"),
    (["-np", "3", "--max-np", "2"], "--max-np (2) must be >= -np (3)"),
    (["-np", "2", "--min-np", "0"], "--min-np must be >= 1"),
    (["-np", "2", "--min-np", "1", "--keep-going"], "--keep-going cannot go with an elastic"),
    (["-np", "2", "--min-np", "1", "--elastic-timeout", "0"], "--elastic-timeout must be"),
    (["-np", "2", "--host-discovery-script", "true", "--slots-per-host", "0"],
     "--slots-per-host must be"),
])
def test_malformed_elastic_flags_are_refused_naming_the_flag(flags, message, capsys):
    with pytest.raises(SystemExit) as stopped:
        cli.main(flags + ["python", "train.py"])
    assert stopped.value.code == 2
    assert message in capsys.readouterr().err


# ------------------------------------------------- the launcher's loop, runs simulated
class SimulatedJob:
    """`cli.run_job` simulated: each run plays one scripted outcome - ("exit", code, label)
    after `on_poll` was called `polls` times, during which the test's `during(run, poll)`
    may change the discovered slots (as the ranks of a fit with a backup, a run that finds
    a resize request ends with every rank's 42)."""

    def __init__(self, outcomes, slots, during=None):
        self.outcomes, self.slots, self.during = list(outcomes), slots, during
        self.sizes, self.restart_counts = [], []

    def __call__(self, args, restart, num_proc, extra_env, on_poll):
        self.sizes.append(num_proc)
        self.restart_counts.append(restart)
        channel = extra_env["TFDIST_ELASTIC_DIR"]
        outcome = self.outcomes.pop(0)
        for poll in range(50):
            if self.during is not None:
                self.during(len(self.sizes) - 1, poll, self)
            on_poll()
            if outcome == "take-resize" and _requested(channel):
                # the chief's backup at the agreed step, as the ranks' `record_backup` writes it
                with open(os.path.join(channel, elastic_channel.BACKUP_FILE), "w") as f:
                    json.dump({"epoch": 1, "steps_done": 4, "iterations": 16,
                               "world_size": num_proc}, f)
                return 42, _group(("0", 42))
        if isinstance(outcome, tuple):
            return outcome[1], _group((outcome[2], outcome[1]))
        return 0, _group(None)


def _requested(channel):
    return os.path.exists(os.path.join(channel, elastic_channel.REQUEST_FILE))


def _group(failure):
    return types.SimpleNamespace(failure=failure, stopped_by_signal=None)


class ScriptedPoller:
    def __init__(self, job):
        self.job = job

    def latest(self):
        return self.job.slots


def _args(**overrides):
    args = cli.build_parser().parse_args(["-np", "3", "python", "x.py"])
    args.min_np, args.max_np, args.host_discovery_script = 2, 3, "simulated"
    args.max_restarts, args.reset_limit, args.elastic_timeout = None, None, 5.0
    for key, value in overrides.items():
        setattr(args, key, value)
    return args


def _run_loop(args, job, monkeypatch, start_slots):
    members = Membership(args.num_proc, args.min_np, args.max_np, discovers=True)
    monkeypatch.setattr(host_discovery, "INTERVAL_SECONDS", 0.02)
    channel = tempfile.mkdtemp()
    return elastic_job._loop(args, job, members, ScriptedPoller(job), channel,
                             members.start(start_slots))


def test_kill_shrink_then_grow_back_then_finish(monkeypatch, capsys):
    def during(run, poll, job):
        if run == 1 and poll == 5:
            job.slots = 2  # capacity taken away (already the job's size)
        if run == 1 and poll == 10:
            job.slots = 3  # ... and given back

    job = SimulatedJob([("exit", 137, "1"), "take-resize", "finish"], 3, during)
    assert _run_loop(_args(), job, monkeypatch, 3) == 0
    assert job.sizes == [3, 2, 3]
    assert job.restart_counts == [0, 1, 2]
    err = capsys.readouterr().err
    assert "resizing from 3 to 2 processes: rank 1 exited with code 137" in err
    assert ("resizing from 2 to 3 processes: the discovery script reports 3 slot(s) instead of "
            "2; the ranks resume from the backup at epoch 2 after 4 of its steps "
            "(optimizer step 16, written by 2 process(es))") in err


def test_capacity_below_min_np_waits_then_gives_up_after_the_timeout(monkeypatch, capsys):
    def during(run, poll, job):
        if run == 0 and poll == 2:
            job.slots = 1

    job = SimulatedJob(["take-resize"], 3, during)
    assert _run_loop(_args(elastic_timeout=0.3), job, monkeypatch, 3) == 1
    assert job.sizes == [3]
    err = capsys.readouterr().err
    assert "waiting up to 0.3 s (--elastic-timeout)" in err
    assert "fewer than --min-np 2 slots, for 0.3 s (--elastic-timeout): the job stops" in err


def test_a_failure_loop_ends_at_max_restarts_and_reset_limit(monkeypatch, capsys):
    job = SimulatedJob([("exit", 7, "0")] * 3, 5)
    args = _args(max_np=5, max_restarts=1)
    assert _run_loop(args, job, monkeypatch, 5) == 7
    assert job.sizes == [3, 2]
    assert "out of restarts (--max-restarts 1)" in capsys.readouterr().err
    job = SimulatedJob(["take-resize", "take-resize", "finish"], 3,
                       lambda run, poll, job: setattr(job, "slots", 2 + (run + poll // 3) % 2))
    assert _run_loop(_args(reset_limit=1), job, monkeypatch, 3) == 42
    assert "--reset-limit 1: it stops" in capsys.readouterr().err
