"""Bad input and dead peers end in a clear error and a non-zero exit, never a hang."""

import socket

import pytest

from helpers import script, tf_config_job, tfdist_run


def run_ranks_with_tf_config(ranks, world, mode_args, timeout_s, busy_port=None):
    """Start the given ranks of a `world`-process failure_modes.py job under TF_CONFIG."""
    procs, addresses, _ = tf_config_job(ranks, world, [script("failure_modes.py")] + mode_args,
                                        timeout_s, busy_port=busy_port)
    return procs, addresses


def test_crashed_rank_fails_the_job_naming_it():
    result = tfdist_run(3, [script("failure_modes.py"), "crash", "2"], timeout=200,
                        run_timeout=60)
    assert result.returncode == 3, result.stdout[-2000:] + result.stderr[-2000:]
    assert "rank 2 exited with code 3" in result.stderr


def test_survivors_detect_a_dead_peer_without_a_launcher():
    """Under TF_CONFIG (no tfdist-run to kill anybody) the survivor must fail by itself."""
    # The job timeout (300 s) is far beyond the ceiling of the wait: the survivor must
    # notice the dead peer itself, and say so (a timeout would name no peer).
    procs, addresses = run_ranks_with_tf_config([0, 1], 2, ["crash", "1"], timeout_s=300)
    procs[1].communicate(timeout=200)
    out0, _ = procs[0].communicate(timeout=200)
    assert procs[1].returncode == 3
    assert procs[0].returncode != 0, out0[-2000:]
    assert f"peer rank 1 ({addresses[1]})" in out0, out0[-3000:]


@pytest.mark.slow  # make test-all (make test stays within 20 min: tests/tiers.py)
def test_a_peer_that_exits_first_after_training_is_not_a_failure():
    result = tfdist_run(2, [script("failure_modes.py"), "late_exit"], timeout=200, run_timeout=60)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert result.stdout.count("finished") == 2
    assert "unreachable" not in result.stdout + result.stderr, result.stderr[-2000:]


@pytest.mark.slow  # make test-all (make test stays within 20 min: tests/tiers.py)
def test_missing_peer_times_out_naming_it():
    procs, addresses = run_ranks_with_tf_config([0], 2, ["train"], timeout_s=8)
    out, _ = procs[0].communicate(timeout=200)
    assert procs[0].returncode != 0
    assert f"rank 1 ({addresses[1]}) did not come up within the 8 s timeout" in out, out[-2000:]


def test_port_in_use_is_a_clear_error():
    with socket.socket() as busy:
        busy.bind(("", 0))
        busy.listen()
        port = busy.getsockname()[1]
        procs, _ = run_ranks_with_tf_config([0], 2, ["train"], timeout_s=10, busy_port=port)
        out, _ = procs[0].communicate(timeout=120)
    assert procs[0].returncode != 0
    assert f"port {port} is already in use" in out, out[-2000:]


def test_different_models_on_different_ranks_is_a_clear_error():
    result = tfdist_run(2, [script("failure_modes.py"), "mismatch"], timeout=200, run_timeout=60)
    assert result.returncode != 0
    assert "every rank must build the same model" in result.stdout, result.stdout[-3000:]


def test_rank_alive_but_out_of_step_fails_within_the_timeout():
    result = tfdist_run(2, [script("failure_modes.py"), "stall"], timeout=90, run_timeout=10)
    assert result.returncode != 0
    assert "waited more than the 10 s timeout for its peers" in result.stdout, \
        result.stdout[-3000:]
