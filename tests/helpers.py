"""Helpers for tests that launch real processes: launchers, TF_CONFIG jobs, reports, comparisons.

Imported by the test modules (`from helpers import ...`); fixtures live in `conftest.py`.
"""

import json
import os
import re
import shutil
import subprocess
import sys
import zipfile

import h5py
import numpy as np
import pytest

from benchmarks.harness import open_mpi_root_env
from tfdist.comm.ports import pick_ports

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPTS = os.path.join(REPO, "tests", "scripts")


def _job_env(run_timeout, extra_env):
    env = dict(os.environ)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    for stale in ("TF_CONFIG", "HOROVOD_RANK", "TFDIST_RANK", "TFDIST_ROLE"):
        env.pop(stale, None)
    env["TFDIST_TIMEOUT"] = str(run_timeout)
    env["PYTHONFAULTHANDLER"] = "1"  # a crash in native code shows the Python stacks
    env.update(open_mpi_root_env())  # what a root user must set for mpirun
    for name, value in (extra_env or {}).items():  # None: leave the variable unset
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    return env


def launch_command(kind, np_, script_args, run_timeout=120, launcher=None):
    """The command line that starts `np_` processes of `python <script_args>`.

    kind: "tfdist-run" (with extra `launcher` arguments), "horovodrun" (Gloo,
    this host), "mpirun" (Open MPI, this host, more processes than cores
    allowed), "srun" (the local Slurm of scripts/local_slurm.sh; "srun-pmix": the same
    with `--mpi=pmix`, an MPI job) or "ray"
    (Ray Train's TensorflowTrainer, tests/scripts/ray_train_job.py).
    """
    if kind == "horovodrun":
        horovodrun_path = os.path.join(os.path.dirname(sys.executable), "horovodrun")
        return [horovodrun_path, "--gloo", "-np", str(np_), "-H", f"localhost:{np_}",
                sys.executable] + script_args
    if kind == "mpirun":
        return ["mpirun", "--oversubscribe", "-np", str(np_), sys.executable] + script_args
    if kind == "srun":
        return ["srun", "-n", str(np_), sys.executable] + script_args
    if kind == "srun-pmix":  # an MPI job under srun (Slurm's PMIx plugin)
        return ["srun", "--mpi=pmix", "-n", str(np_), sys.executable] + script_args
    if kind == "ray":  # launcher: ray_train_job.py's options (--max-failures N)
        return [sys.executable, script("ray_train_job.py")] + (launcher or []) + [
            str(np_)] + script_args
    return [sys.executable, "-m", "tfdist.launch", "-np", str(np_), "--timeout",
            str(run_timeout)] + (launcher or []) + [sys.executable] + script_args


def _run(command, env, timeout):
    result = subprocess.run(command, env=env, capture_output=True, timeout=timeout)
    # Decode by hand: text mode would turn the progress bar's "\r" into line breaks.
    result.stdout = result.stdout.decode(errors="replace")
    result.stderr = result.stderr.decode(errors="replace")
    return result


def tfdist_run(np_, script_args, timeout=600, run_timeout=120, extra_env=None, launcher=None):
    """Run `tfdist-run -np np_ python <script_args>`; return the CompletedProcess."""
    return _run(launch_command("tfdist-run", np_, script_args, run_timeout, launcher),
                _job_env(run_timeout, extra_env), timeout)


def horovodrun(np_, script_args, timeout=600, run_timeout=120, extra_env=None):
    """Run `horovodrun --gloo -np np_ python <script_args>` on this host."""
    return _run(launch_command("horovodrun", np_, script_args),
                _job_env(run_timeout, extra_env), timeout)


def run_job(kind, np_, script_args, timeout=600, run_timeout=120, extra_env=None):
    """Run `np_` processes of `python <script_args>` under launcher `kind` (see launch_command)."""
    return _run(launch_command(kind, np_, script_args),
                _job_env(run_timeout, extra_env), timeout)


def start_job(kind, np_, script_args, run_timeout=120, launcher=None):
    """Start a job like `tfdist_run` / `horovodrun` without waiting: a Popen with merged output."""
    return subprocess.Popen(launch_command(kind, np_, script_args, run_timeout, launcher),
                            env=_job_env(run_timeout, None), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, errors="replace")


def failure_report(done, tail=3000):
    """What a failed job printed: any native crash's stacks in full, then the output's tails.

    A segmentation fault with PYTHONFAULTHANDLER=1 prints every thread's
    Python stack; a plain tail would cut them off.
    """
    text = done.stdout + done.stderr
    crashes = []
    for match in re.finditer(r"(?:\[\d+\] )?Fatal Python error", text):
        crashes.append(text[match.start():match.start() + 6000])
    return "\n".join(crashes + ["--- stdout tail ---", done.stdout[-tail:],
                                 "--- stderr tail ---", done.stderr[-tail:]])


def tf_config_job(worker_ranks, world, script_args, timeout_s, num_servers=0, busy_port=None):
    """Start some workers (and `num_servers` ps tasks) of a TF_CONFIG job, without a launcher.

    Returns (processes keyed by worker rank and "ps<i>", worker addresses,
    server addresses); output is piped. `busy_port` replaces worker 0's port.
    """
    ports = pick_ports(world + num_servers)
    workers = [f"127.0.0.1:{p}" for p in ports[:world]]
    servers = [f"127.0.0.1:{p}" for p in ports[world:]]
    if busy_port is not None:
        workers[0] = f"127.0.0.1:{busy_port}"
    cluster = {"worker": workers, **({"ps": servers} if servers else {})}
    tasks = [("ps", index, f"ps{index}") for index in range(num_servers)]
    tasks += [("worker", rank, rank) for rank in worker_ranks]
    procs = {}
    for kind, index, key in tasks:
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", TFDIST_TIMEOUT=str(timeout_s))
        for stale in ("TFDIST_RANK", "TFDIST_ROLE", "HOROVOD_RANK"):
            env.pop(stale, None)
        env["TF_CONFIG"] = json.dumps({"cluster": cluster, "task": {"type": kind, "index": index}})
        procs[key] = subprocess.Popen([sys.executable] + script_args, env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return procs, workers, servers


def max_abs_difference(a, b):
    """Largest absolute difference over arrays with the same keys."""
    assert a.keys() == b.keys()
    return max(float(np.max(np.abs(a[k] - b[k]))) for k in a)


def script(name):
    return os.path.join(SCRIPTS, name)


def train_equivalence(launch, world, prefix, *options, **launch_options):
    """Run tests/scripts/train_equivalence.py on `world` processes; every rank's arrays.

    `launch` is `tfdist_run` or `horovodrun`; `options` go to the script.
    """
    done = launch(world, [script("train_equivalence.py"), prefix, *options],
                  **{"timeout": 900, **launch_options})
    assert done.returncode == 0, failure_report(done)
    return load_ranks(prefix, world)


def load_ranks(prefix, world):
    """The arrays each rank of a case script saved as `<prefix>.rank<r>.npz`."""
    return [dict(np.load(f"{prefix}.rank{rank}.npz")) for rank in range(world)]


def onednn(setting):
    """The environment that forces TensorFlow's oneDNN CPU kernels on ("1") or off ("0").

    TensorFlow turns them on by default only on some CPUs (AVX-512 VNNI or
    BF16), and some of its kernels behave differently on zero rows with them
    (experiments/onednn_zero_rows.py); the equivalence and real-world suites
    force each setting in one launch so that no CPU passes them by luck.
    Single-process results move by at most 2e-6 between the two settings
    here, far inside the suites' 1e-4, so both compare with one reference.
    """
    return {"TF_ENABLE_ONEDNN_OPTS": setting}


def run_case_script(name, prefix, world, script_args, cases=None, launcher=None,
                    extra_env=None):
    """Every rank's arrays from a case script (`keras_patterns.py`, `real_world.py`) on
    `world` processes; `cases` is its comma-separated `--cases` list (all when None)."""
    args = [script(name), prefix] + list(script_args) + (["--cases", cases] if cases else [])
    done = (launcher or tfdist_run)(world, args, timeout=900, run_timeout=180,
                                    **({"extra_env": extra_env} if extra_env else {}))
    assert done.returncode == 0, failure_report(done)
    return load_ranks(prefix, world)


def assert_ranks_match_reference(reference, ranks, tolerance, what, skip=()):
    """Every rank saved the same arrays as rank 0, bit for bit, and rank 0's arrays equal
    `reference`'s within `tolerance(key)` = (rtol, atol), except keys starting with `skip`.

    `what` names the reference in messages. Returns the cases (key prefixes) compared.
    """
    chief = ranks[0]
    cases = sorted({key.split("/")[0] for key in chief})
    assert cases, "the worker script ran no case"
    for key, value in chief.items():
        for rank, other in enumerate(ranks[1:], start=1):
            np.testing.assert_array_equal(other[key], value,
                                          err_msg=f"rank {rank} differs from rank 0 in {key}")
        if skip and key.startswith(tuple(skip)):
            continue
        assert key in reference, f"{key} missing from {what}"
        rtol, atol = tolerance(key)
        np.testing.assert_allclose(value, reference[key], rtol=rtol, atol=atol,
                                   err_msg=f"{len(ranks)} processes differ from {what} in {key}")
    return cases


def only_configs(results, configs):
    """The entries of `results` ("<config>/<name>") that belong to `configs`."""
    return {key: value for key, value in results.items() if key.split("/", 1)[0] in configs}


def require_launcher(kind):
    """Skip (or fail, where CI requires it) unless launcher `kind` can start jobs here.

    mpirun: Open MPI and a Horovod built with MPI (`make install` provides both; fails
    unless TFDIST_WITHOUT_MPI is set). srun: a Slurm that runs a one-task step
    (`scripts/local_slurm.sh` starts one; fails when TFDIST_REQUIRE_SLURM is set).
    """
    import shutil  # pylint: disable=import-outside-toplevel

    from benchmarks.harness import mpirun_available  # pylint: disable=import-outside-toplevel

    problem, required = None, False
    if kind == "mpirun":
        required = not os.environ.get("TFDIST_WITHOUT_MPI")
        if not mpirun_available():
            problem = "Open MPI's mpirun or a Horovod built with MPI is missing (make install)"
    elif kind == "srun":
        required = bool(os.environ.get("TFDIST_REQUIRE_SLURM"))
        if shutil.which("srun") is None:
            problem = "srun is not installed (scripts/local_slurm.sh starts a one-node Slurm)"
        else:
            try:
                subprocess.run(["srun", "-n", "1", "true"], check=True, timeout=60,
                               capture_output=True)
            except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as e:
                problem = f"srun does not run jobs here ({e}); start Slurm: scripts/local_slurm.sh"
    if problem:
        if required:
            pytest.fail(problem)
        pytest.skip(problem)


def case_parameters(names, fast, uses_horovod):
    """pytest parameters for named cases: `slow` unless in `fast`, `horovod` where it is used."""
    parameters = []
    for name in names:
        marks = ([] if name in fast else [pytest.mark.slow])
        marks += [pytest.mark.horovod] if uses_horovod(name) else []
        parameters.append(pytest.param(name, marks=marks, id=name))
    return parameters


CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                  "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync"]


def headless_browser():
    """Headless Chromium driven by Selenium through Debian's chromedriver (skip if absent)."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver_path = shutil.which("chromedriver")
    if chromium is None or driver_path is None:
        if os.environ.get("TFDIST_REQUIRE_BROWSER"):
            pytest.fail("TFDIST_REQUIRE_BROWSER is set but chromium or chromedriver is missing")
        pytest.skip("chromium and chromedriver are not installed "
                    "(Debian: apt-get install chromium chromium-driver)")
    from selenium import webdriver  # pylint: disable=import-outside-toplevel

    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in CHROMIUM_FLAGS + ["--window-size=1400,1000"]:
        options.add_argument(flag)
    return webdriver.Chrome(service=webdriver.ChromeService(executable_path=driver_path),
                            options=options)


def h5_arrays(path):
    """Every dataset of a Keras file (a .keras zip's weights, or a .weights.h5), by path."""
    if str(path).endswith(".keras"):
        with zipfile.ZipFile(path) as archive:
            target = os.path.join(os.path.dirname(path), "extracted.weights.h5")
            with open(target, "wb") as out:
                out.write(archive.read("model.weights.h5"))
            path = target
    arrays = {}
    with h5py.File(path, "r") as f:
        f.visititems(lambda name, item: arrays.__setitem__(name, item[()])
                     if isinstance(item, h5py.Dataset) else None)
    return arrays


def assert_same_keras_file_arrays(plain_path, sharded_path, rtol=1e-5, atol=1e-4):
    """Two Keras files (.keras or .weights.h5) hold the same datasets, shapes and values (the
    optimizer's among them)."""
    plain, sharded = h5_arrays(plain_path), h5_arrays(sharded_path)
    assert sorted(plain) == sorted(sharded)
    assert any("optimizer" in key for key in plain), sorted(plain)
    for key, value in plain.items():
        assert np.shape(sharded[key]) == np.shape(value), key
        np.testing.assert_allclose(sharded[key], value, rtol=rtol, atol=atol, err_msg=key)
