"""tfdist-run: environment, output prefixes, exit codes, failure and cleanup."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from helpers import script, tfdist_run


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie is not alive
        return f.read().split()[2] != "Z"


def _survivors(pids, ceiling=60.0):
    """The pids still alive once all have exited or `ceiling` seconds have passed."""
    deadline = time.monotonic() + ceiling
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    return [p for p in pids if _alive(p)]


def test_every_rank_gets_its_environment_and_prefix():
    result = tfdist_run(3, [script("launcher_probe.py"), "env"], timeout=60)
    assert result.returncode == 0, result.stderr
    envs = {}
    for line in result.stdout.splitlines():
        label, _, payload = line.partition(" ")
        envs[label] = json.loads(payload)
    assert sorted(envs) == ["[0]", "[1]", "[2]"]
    for rank in range(3):
        env = envs[f"[{rank}]"]
        assert env["TFDIST_RANK"] == str(rank)
        assert env["TFDIST_WORLD_SIZE"] == "3"
        assert env["TFDIST_TIMEOUT"] == "120"
        assert len(env["TFDIST_WORKER_ADDRESSES"].split(",")) == 3
    assert len({e["TFDIST_WORKER_ADDRESSES"] for e in envs.values()}) == 1
    # No rank created a tfdist strategy: the launcher says the processes ran independently.
    assert ("tfdist-run: none of the 3 processes created a tfdist strategy, so they ran "
            "independently") in result.stderr, result.stderr
    assert "strategy.scope()" in result.stderr


def test_single_process():
    result = tfdist_run(1, [script("launcher_probe.py"), "env"], timeout=60)
    assert result.returncode == 0
    assert "ran independently" not in result.stderr  # one process: nothing to distribute
    assert json.loads(result.stdout.split(" ", 1)[1])["TFDIST_WORLD_SIZE"] == "1"


def test_servers_are_started_with_their_role(tmp_path):
    result = tfdist_run(2, [script("launcher_probe.py"), "env", str(tmp_path / "server_up")],
                        timeout=60, launcher=["--num-servers", "1"])
    server_lines = [l for l in result.stdout.splitlines() if l.startswith("[s0]")]
    assert len(server_lines) == 1
    env = json.loads(server_lines[0].split(" ", 1)[1])
    assert env["TFDIST_ROLE"] == "server" and env["TFDIST_SERVER_INDEX"] == "0"
    assert result.returncode == 0


def test_failing_rank_stops_the_job_with_its_exit_code_and_name():
    # The other ranks sleep 600 s: only their termination ends the job within the ceiling.
    result = tfdist_run(3, [script("launcher_probe.py"), "fail", "1", "7"], timeout=300)
    assert result.returncode == 7
    assert "rank 1 exited with code 7" in result.stderr
    assert "[1] failing on purpose" in result.stdout


def _attempts(stdout):
    """Rank 0's TFDIST_* environment in each run of the job, in order."""
    return [json.loads(line.split(" ", 1)[1]) for line in stdout.splitlines()
            if line.startswith("[0] {")]


def test_a_failed_job_is_restarted_whole_on_new_ports_up_to_max_restarts():
    result = tfdist_run(3, [script("launcher_probe.py"), "fail-until", "2"], timeout=300,
                        launcher=["--max-restarts", "2"])
    assert result.returncode == 0, result.stderr
    attempts = _attempts(result.stdout)
    assert [a["TFDIST_RESTART_COUNT"] for a in attempts] == ["0", "1", "2"]
    addresses = [a["TFDIST_WORKER_ADDRESSES"] for a in attempts]
    assert len(set(addresses)) == 3, addresses  # fresh ports for every run
    for restart in (1, 2):
        assert (f"rank 1 exited with code 7; restarting the job ({restart} of 2 restarts)"
                in result.stderr), result.stderr

    # Out of restarts: the job fails with the failure's code, after one restart.
    result = tfdist_run(2, [script("launcher_probe.py"), "fail-until", "2"], timeout=300,
                        launcher=["--max-restarts", "1"])
    assert result.returncode == 7
    assert len(_attempts(result.stdout)) == 2
    assert result.stderr.count("restarting the job") == 1


def test_no_orphans_after_failure(tmp_path):
    pidfile = tmp_path / "pids"
    # rank 0's children sleep; the job is killed by a failing rank's exit.
    wrapper = tmp_path / "probe.sh"
    wrapper.write_text(
        f'if [ "$TFDIST_RANK" = "1" ]; then sleep 2; exit 3; fi\n'
        f'exec {sys.executable} {script("launcher_probe.py")} orphan {pidfile}\n'
    )
    env = dict(os.environ)
    result = subprocess.run(
        [sys.executable, "-m", "tfdist.launch", "-np", "2", "bash", str(wrapper)],
        capture_output=True, text=True, timeout=300, env=env,
    )
    assert result.returncode == 3
    pids = [int(p) for p in pidfile.read_text().split()]
    assert pids
    assert not _survivors(pids), "processes outlived tfdist-run"


def test_sigterm_is_forwarded_and_nothing_is_left(tmp_path):
    pidfile = tmp_path / "pids"
    launcher = subprocess.Popen(
        [sys.executable, "-m", "tfdist.launch", "-np", "2", sys.executable,
         script("launcher_probe.py"), "orphan", str(pidfile)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    deadline = time.monotonic() + 120  # a generous ceiling on a busy machine
    while (not pidfile.exists() or len(pidfile.read_text().split()) < 4) \
            and time.monotonic() < deadline:
        time.sleep(0.1)
    launcher.send_signal(signal.SIGTERM)
    _, stderr = launcher.communicate(timeout=120)
    assert launcher.returncode != 0
    assert "SIGTERM" in stderr
    pids = [int(p) for p in pidfile.read_text().split()]
    assert not _survivors(pids), "processes outlived tfdist-run"


def test_port_base_in_use_is_a_clear_error():
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = tfdist_run(2, [script("launcher_probe.py"), "env"], timeout=60,
                            launcher=["--port-base", str(port)])
    assert result.returncode != 0
    assert f"[{port}]" in result.stderr and "already in use" in result.stderr


NOISY_RANK = r"""
import sys, warnings
print("WARNING: All log messages before absl::InitializeLog() is called are written to STDERR",
      file=sys.stderr, flush=True)
print("I0000 00:00:1795476215.236518   24731 port.cc:153] oneDNN custom operations are on.",
      file=sys.stderr, flush=True)
print("I0000 00:00:1795476215.527891   24731 cpu_feature_guard.cc:227] This TensorFlow binary "
      "is optimized to use available CPU instructions", file=sys.stderr, flush=True)
print("To enable the following instructions: AVX2 FMA, in other operations", file=sys.stderr,
      flush=True)
warnings.warn("the same on every rank")
print("To enable the ranks to talk, keep this line", flush=True)
"""


def test_startup_noise_is_left_out_and_a_warning_shown_once_unless_verbose(tmp_path):
    noisy = tmp_path / "noisy.py"
    noisy.write_text(NOISY_RANK)
    command = [sys.executable, "-m", "tfdist.launch", "-np", "3", sys.executable, str(noisy)]
    quiet = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert quiet.returncode == 0, quiet.stderr
    assert "absl::InitializeLog" not in quiet.stdout and "oneDNN" not in quiet.stdout
    assert "To enable the following instructions" not in quiet.stdout
    assert quiet.stdout.count("UserWarning: the same on every rank") == 1, quiet.stdout
    assert quiet.stdout.count("To enable the ranks to talk, keep this line") == 3
    verbose = subprocess.run(command[:3] + ["--verbose"] + command[3:], capture_output=True,
                             text=True, timeout=120)
    assert verbose.stdout.count("UserWarning: the same on every rank") == 3, verbose.stdout
    assert verbose.stdout.count("oneDNN custom operations are on") == 3


class _Elastic:
    """An elastic tfdist-run of probe ranks (launcher_probe.py "elastic"), driven by a test:
    the discovery script reads `slots`; each run's ranks print their environment and pid."""

    def __init__(self, tmp_path, slots, launcher_args):
        self.slots_file, self.done = tmp_path / "slots", tmp_path / "done"
        self.set_slots(slots)
        self.runs = []  # per run of the job: {rank: environment}
        self.output = []
        self.job = subprocess.Popen(
            [sys.executable, "-m", "tfdist.launch", "--host-discovery-script",
             f"cat {self.slots_file}"] + launcher_args
            + [sys.executable, script("launcher_probe.py"), "elastic", str(self.done)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    def set_slots(self, count):
        self.slots_file.write_text(f"localhost:{count}\n")

    def wait_for_run(self, size, ceiling=120.0):
        """Read the output until a run of `size` ranks has started; its {rank: environment}."""
        deadline = time.monotonic() + ceiling
        current = {}
        for line in self.job.stdout:
            self.output.append(line)
            if time.monotonic() > deadline:
                break
            if " {" not in line or not line.startswith("["):
                continue
            env = json.loads(line.split(" ", 1)[1])
            if env["TFDIST_WORLD_SIZE"] != str(size):
                continue
            current[int(env["TFDIST_RANK"])] = env
            if len(current) == size:
                self.runs.append(current)
                return current
        raise AssertionError("".join(self.output)[-3000:])

    def finish(self):
        self.done.touch()
        rest, _ = self.job.communicate(timeout=120)
        self.output.append(rest)
        return self.job.returncode, "".join(self.output)


def test_an_elastic_job_shrinks_on_a_lost_rank_grows_and_shrinks_with_the_slots(tmp_path):
    job = _Elastic(tmp_path, 3, ["-np", "3", "--min-np", "2", "--max-np", "4"])
    try:
        first = job.wait_for_run(3)
        os.kill(first[1]["pid"], signal.SIGKILL)  # a lost process: the job goes on with 2
        job.wait_for_run(2)
        job.set_slots(4)  # more slots: a resize request, every rank backs up, 4 start
        job.wait_for_run(4)
        job.set_slots(1)  # fewer than --min-np: the job stops at an agreed step and waits
        time.sleep(3)
        job.set_slots(2)
        last = job.wait_for_run(2)
        code, output = job.finish()
    finally:
        job.job.kill()
    assert code == 0, output[-3000:]
    restarts = [run[0]["TFDIST_RESTART_COUNT"] for run in job.runs]
    assert restarts == ["0", "1", "2", "4"] or restarts == ["0", "1", "2", "3"], output
    assert len({run[0]["TFDIST_WORKER_ADDRESSES"] for run in job.runs}) == 4  # new ports
    assert last[0]["TFDIST_ELASTIC_DIR"]
    assert "resizing from 3 to 2 processes: rank 1 exited with code 137" in output, output
    assert ("resizing from 2 to 4 processes: the discovery script reports 4 slot(s) instead of 3"
            in output), output
    assert "took tfdist-run's request to resize from 2 to 4 processes" in output
    assert "fewer than --min-np 2 slots: waiting up to 600 s" in output, output
    assert "resizing from 4 to 2 processes: the discovery script reports 2 slot(s)" in output


def test_an_elastic_job_below_min_np_gives_up_after_the_elastic_timeout(tmp_path):
    job = _Elastic(tmp_path, 2, ["-np", "2", "--elastic-timeout", "3"])
    try:
        job.wait_for_run(2)
        job.set_slots(1)
        rest, _ = job.job.communicate(timeout=120)
    finally:
        job.job.kill()
    output = "".join(job.output) + rest
    assert job.job.returncode == 1, output
    assert ("fewer than --min-np 2 slots, for 3 s (--elastic-timeout): the job stops"
            in output), output


def test_an_elastic_job_waiting_for_slots_stops_on_sigterm(tmp_path):
    job = _Elastic(tmp_path, 2, ["-np", "2"])
    try:
        job.wait_for_run(2)
        job.set_slots(1)  # below --min-np (2): the ranks stop, the launcher waits 600 s ...
        for line in job.job.stdout:
            job.output.append(line)
            if "waiting up to 600 s" in line:
                break
        job.job.send_signal(signal.SIGTERM)  # ... unless told to stop
        rest, _ = job.job.communicate(timeout=60)
    finally:
        job.job.kill()
    output = "".join(job.output) + rest
    assert job.job.returncode == 1, output
    assert "received SIGTERM while waiting: the job stops" in output, output
