"""ParameterServerStrategy (sync): same training as one process with dedicated or
co-located servers; balanced partition; dead servers and dead workers fail clearly."""

import signal
import subprocess
import time

import numpy as np
import pytest

from helpers import (failure_report, max_abs_difference, only_configs, script, tf_config_job,
                     tfdist_run)

TOLERANCE = 1e-4
CONFIGS = ("adam", "adam_tfdata")  # numpy input; shuffled tf.data with steps_per_execution=2
TRAINING = ["--configs", ",".join(CONFIGS)]


def train_ps(tmp_path, workers, servers):
    prefix = str(tmp_path / f"ps{workers}_{servers}")
    launcher = ["--num-servers", str(servers)] if servers else []
    done = tfdist_run(workers, [script("train_equivalence.py"), prefix, "--strategy", "ps"]
                      + TRAINING, timeout=900, run_timeout=120, launcher=launcher)
    assert done.returncode == 0, failure_report(done)
    return [dict(np.load(f"{prefix}.rank{r}.npz")) for r in range(workers)], done


@pytest.fixture(scope="module")
def one_process(one_process_run):
    return only_configs(one_process_run(), CONFIGS)


@pytest.mark.parametrize("workers,servers", [
    pytest.param(2, 0, marks=pytest.mark.slow), (3, 1),  # 0: co-located, one per worker
    pytest.param(4, 2, marks=pytest.mark.slow), pytest.param(2, 1, marks=pytest.mark.slow), pytest.param(3, 2, marks=pytest.mark.slow),
    pytest.param(4, 0, marks=pytest.mark.slow)])
def test_ps_trains_like_one_process(one_process, tmp_path, workers, servers):
    ranks, done = train_ps(tmp_path, workers, servers)
    assert "h_loss" in {k.split("/", 1)[1] for k in one_process}
    diff = max_abs_difference(one_process, ranks[0])
    assert diff <= TOLERANCE, f"{workers} workers, {servers} servers differ from 1 by {diff}"
    for rank in range(1, workers):  # every worker pulls the same sums
        assert max_abs_difference(ranks[0], ranks[rank]) == 0.0
    kind = "dedicated" if servers else "co-located"
    output = done.stdout + done.stderr  # tfdist-run relays every process's output
    assert f"{servers or workers} {kind} server(s) for {workers} worker(s)" in output
    assert "[0] tfdist parameter server partition:" in output  # logged on the chief only
    assert "[1] tfdist parameter server partition:" not in output


def ps_job(workers, servers, mode_args, timeout_s):
    """Start a TF_CONFIG job of failure_modes.py with workers and ps tasks, no launcher."""
    procs, _, server_addresses = tf_config_job(
        range(workers), workers, [script("failure_modes.py")] + mode_args + ["--strategy", "ps"],
        timeout_s, num_servers=servers)
    return procs, server_addresses


def wait_for_line(proc, text, timeout):
    deadline = time.monotonic() + timeout
    seen = []
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        seen.append(line)
        if text in line:
            return "".join(seen)
        if not line and proc.poll() is not None:
            break
    raise AssertionError(f"never saw {text!r}: " + "".join(seen)[-3000:])


def test_dead_server_fails_the_workers_naming_it():
    procs, servers = ps_job(2, 1, ["slow"], timeout_s=60)
    try:
        head = wait_for_line(procs[0], "epoch 1 started", timeout=120)
        procs["ps0"].send_signal(signal.SIGKILL)
        outputs = {rank: procs[rank].communicate(timeout=200)[0] for rank in (0, 1)}
    finally:
        for proc in procs.values():
            proc.kill()
    outputs[0] = head + outputs[0]
    for rank, out in outputs.items():
        assert procs[rank].returncode not in (0, None), out[-3000:]
        assert f"parameter server 0 ({servers[0]})" in out, out[-3000:]
        assert f"parameter server 0 ({servers[0]}) is unreachable (connection refused); " \
            "it has probably died" in out.replace("\n", " "), out[-3000:]
        assert "\nfinished" not in out and "] finished" not in out


def test_dead_worker_fails_the_server_and_the_other_workers():
    procs, servers = ps_job(2, 1, ["crash", "1"], timeout_s=60)
    try:
        outputs = {name: proc.communicate(timeout=150)[0] for name, proc in procs.items()}
    finally:
        for proc in procs.values():
            proc.kill()
    assert procs[1].returncode == 3
    assert procs["ps0"].returncode == 1, outputs["ps0"][-3000:]
    assert "worker rank 1 (" in outputs["ps0"] and "has probably died" in outputs["ps0"], \
        outputs["ps0"][-3000:]
    assert procs[0].returncode not in (0, None)
    assert f"parameter server 0 ({servers[0]}) stopped because worker rank 1" in \
        outputs[0].replace("\n", " ").replace("[", "").replace("]", ""), \
        outputs[0][-3000:]


@pytest.mark.slow  # make test-all (make test stays within 20 min: tests/tiers.py)
def test_servers_exit_cleanly_and_no_process_is_left_behind(tmp_path):
    marker = str(tmp_path)  # unique in the command lines of this test's processes
    done = tfdist_run(2, [script("failure_modes.py"), "train", "--strategy", "ps", "--tag", marker],
                      timeout=300, run_timeout=60, launcher=["--num-servers", "2"])
    assert done.returncode == 0, failure_report(done)
    assert done.stdout.count("finished") == 2
    crashed = tfdist_run(3, [script("failure_modes.py"), "crash", "2", "--strategy", "ps",
                             "--tag", marker], timeout=300, run_timeout=60,
                         launcher=["--num-servers", "1"])
    assert crashed.returncode == 3
    deadline = time.monotonic() + 60  # a generous ceiling for the last exits to be reaped
    while True:
        leftover = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True).stdout
        if not leftover.strip() or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert not leftover.strip(), f"processes left behind: {leftover}"


@pytest.mark.slow
def test_eight_workers_and_two_servers_run_on_two_cores():
    """Server-side waits hold no TensorFlow threads: 10 processes on 2 cores finish."""
    done = tfdist_run(8, [script("failure_modes.py"), "train", "--strategy", "ps"],
                      timeout=900, run_timeout=300, launcher=["--num-servers", "2"])
    assert done.returncode == 0, failure_report(done)
    assert done.stdout.count("finished") == 8
