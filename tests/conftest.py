"""Helpers for tests that launch real processes through tfdist-run."""

import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPTS = os.path.join(REPO, "tests", "scripts")


def tfdist_run(np_, script_args, timeout=600, run_timeout=120, extra_env=None, launcher=None):
    """Run `tfdist-run -np np_ python <script_args>`; return the CompletedProcess."""
    env = dict(os.environ)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    for stale in ("TF_CONFIG", "HOROVOD_RANK", "TFDIST_RANK", "TFDIST_ROLE"):
        env.pop(stale, None)
    env["PYTHONFAULTHANDLER"] = "1"  # a crash in native code shows the Python stacks
    env.update(extra_env or {})
    command = [sys.executable, "-m", "tfdist.launch", "-np", str(np_),
               "--timeout", str(run_timeout)] + (launcher or []) + [sys.executable] + script_args
    result = subprocess.run(command, env=env, capture_output=True, timeout=timeout)
    # Decode by hand: text mode would turn the progress bar's "\r" into line breaks.
    result.stdout = result.stdout.decode(errors="replace")
    result.stderr = result.stderr.decode(errors="replace")
    return result


def horovodrun(np_, script_args, timeout=600, run_timeout=120, extra_env=None):
    """Run `horovodrun --gloo -np np_ python <script_args>` on this host."""
    env = dict(os.environ)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    for stale in ("TF_CONFIG", "HOROVOD_RANK", "TFDIST_RANK", "TFDIST_ROLE"):
        env.pop(stale, None)
    env["TFDIST_TIMEOUT"] = str(run_timeout)
    env["PYTHONFAULTHANDLER"] = "1"  # a crash in native code shows the Python stack
    env.update(extra_env or {})
    launcher = os.path.join(os.path.dirname(sys.executable), "horovodrun")
    command = [launcher, "--gloo", "-np", str(np_), "-H", f"localhost:{np_}",
               sys.executable] + script_args
    result = subprocess.run(command, env=env, capture_output=True, timeout=timeout)
    result.stdout = result.stdout.decode(errors="replace")
    result.stderr = result.stderr.decode(errors="replace")
    return result


def script(name):
    return os.path.join(SCRIPTS, name)


@pytest.fixture
def workdir(tmp_path):
    return tmp_path
