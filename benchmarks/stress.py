"""Stress harness: many short multi-process jobs on an oversubscribed CPU, every outcome classified.

    python -m benchmarks.stress --jobs 120               # make stress STRESS_JOBS=120
    python -m benchmarks.stress --jobs 40 --only ring-collective-3,ps-dedicated-3x2

Each job runs `benchmarks/stress_worker.py` (fit + evaluate + predict + save,
a second model's fit, a custom `train_step` model) through a real launcher,
cycling over every strategy, backend and launcher (`CONFIGURATIONS`), while
`--busy` busy-loop processes keep the CPU oversubscribed. Every job runs in a
fresh temporary directory with core dumps enabled (the kernel's core_pattern
is assumed to be a plain file name such as "core": cores land in the crashing
process's working directory, which the worker makes per process) and
PYTHONFAULTHANDLER=1.

A job is
  ok           every process exited 0 and printed no error line;
  crash        a process died of a signal (exit 128 + N, a core file, or a
               "Fatal Python error" from faulthandler);
  hang         still running at `--job-timeout`: every process of the job is
               then sent SIGABRT (faulthandler's Python stacks + a core), then
               SIGKILL;
  false_alarm  exit 0, but some process printed an ERROR or "probably died" line;
  error        any other non-zero exit (a Python exception).

For every core, `gdb -batch -ex bt -ex "thread apply all bt"` gives the
native stack of the crashing thread and of all threads. Results: a summary
(counts per kind and per configuration, the crashing frames) in
`benchmarks/results/stress.json` (`--out`), and the full native and Python
stacks in the file of the same name ending in `_crashes.json`.
"""

import argparse
import collections
import dataclasses
import datetime
import glob
import json
import os
import random
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from absl import logging

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "stress_worker.py")
DEFAULT_OUT = os.path.join(HERE, "results", "stress.json")
GDB_TIMEOUT_SECONDS = 300
ABORT_GRACE_SECONDS = 20
TOP_FRAMES = 14

# An error-level line from any layer: absl/glog ("E0612 12:00:00.1 ..."), Python logging
# ("ERROR:absl:..."), or tfdist's own failure messages.
ALARM = re.compile(r"probably died|\bERROR\b|(?:^|[\]>:\s])E\d{4} \d\d:\d\d:\d\d")
FATAL = re.compile(r"Fatal Python error")
EXIT_BY_SIGNAL = re.compile(r"exited with (?:code|status) (1[3-5]\d)|signal \d+|"
                            r"Segmentation fault|core dumped")


@dataclasses.dataclass(frozen=True)
class Configuration:
    """One kind of job: a launcher, a process count and the worker's strategy arguments."""

    name: str
    launcher: str  # "tfdist-run" | "horovodrun"
    processes: int
    worker_args: tuple
    launcher_flags: tuple = ()

    def command(self, peer_timeout):
        python = sys.executable
        worker = [python, WORKER, *self.worker_args]
        if self.launcher == "horovodrun":
            horovodrun = os.path.join(os.path.dirname(python), "horovodrun")
            return [horovodrun, "--gloo", "-np", str(self.processes), "-H",
                    f"localhost:{self.processes}", *worker]
        return [python, "-m", "tfdist.launch", "-np", str(self.processes), "--timeout",
                str(peer_timeout), *self.launcher_flags, *worker]


RING_COLLECTIVE = ("--strategy", "ring", "--backend", "collective")
RING_HOROVOD = ("--strategy", "ring", "--backend", "horovod")
TREE = ("--strategy", "tree")
PS = ("--strategy", "ps")
CONFIGURATIONS = (
    Configuration("ring-collective-2", "tfdist-run", 2, RING_COLLECTIVE),
    Configuration("ring-collective-3", "tfdist-run", 3, RING_COLLECTIVE),
    Configuration("ring-collective-horovodrun-2", "horovodrun", 2, RING_COLLECTIVE),
    Configuration("ring-horovod-horovodrun-2", "horovodrun", 2, RING_HOROVOD),
    Configuration("ring-horovod-horovodrun-3", "horovodrun", 3, RING_HOROVOD),
    Configuration("ring-horovod-tfdist-run-2", "tfdist-run", 2, RING_HOROVOD, ("--horovod",)),
    Configuration("tree-3", "tfdist-run", 3, TREE),
    Configuration("tree-4", "tfdist-run", 4, TREE),
    Configuration("ps-dedicated-2x1", "tfdist-run", 2, PS, ("--num-servers", "1")),
    Configuration("ps-dedicated-3x2", "tfdist-run", 3, PS, ("--num-servers", "2")),
    Configuration("ps-colocated-2", "tfdist-run", 2, PS),
    Configuration("ps-colocated-horovodrun-2", "horovodrun", 2, PS),
)


# ------------------------------------------------------------------ processes
def _enable_core_dumps():
    """preexec_fn: unlimited core size (inherited by every process of the job), own session."""
    os.setsid()
    resource.setrlimit(resource.RLIMIT_CORE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))


def processes_in(directory):
    """Pids of live processes whose working directory is `directory` or below it.

    Every process of a job runs there (the launchers' children set up their
    own sessions, so a process group would miss them).
    """
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cwd = os.readlink(f"/proc/{entry}/cwd")
        except OSError:
            continue
        if cwd == directory or cwd.startswith(directory + os.sep):
            pids.append(int(entry))
    return pids


def signal_all(pids, signum):
    for pid in pids:
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass


class BusyLoops:
    """`count` processes spinning on the CPU for as long as the harness runs."""

    def __init__(self, count):
        self.processes = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
                          for _ in range(count)]

    def stop(self):
        for process in self.processes:
            process.kill()
            process.wait()


# ------------------------------------------------------------------- analysis
def native_stacks(core, executable=sys.executable):
    """gdb's backtrace of the crashing thread, then of every thread, for one core file."""
    gdb_commands = ["set pagination off", "set print frame-arguments none",
                    "echo === crashing thread ===\\n", "bt",
                    "echo === all threads ===\\n", "thread apply all bt"]
    command = ["gdb", "-batch", "-nx"]
    for gdb_command in gdb_commands:
        command += ["-ex", gdb_command]
    command += [os.path.realpath(executable), core]
    try:
        done = subprocess.run(command, capture_output=True, text=True, errors="replace",
                              timeout=GDB_TIMEOUT_SECONDS)
    except subprocess.TimeoutExpired:
        return "gdb timed out"
    return without_gdb_chatter(done.stdout + done.stderr[-2000:])


GDB_ADVICE = re.compile(r"auto-load|gdbinit|To enable execution|To completely disable|"
                        r"security protection|^\s*info \"\(gdb\)|^\s*set auto-load|^\s*line to your")


def without_gdb_chatter(text):
    """gdb's output less its per-thread "[New LWP n]" lines and auto-load advice."""
    start = text.find("=== crashing thread ===")
    head, stacks = (text[:start], text[start:]) if start >= 0 else ("", text)
    kept = [line for line in head.splitlines()
            if line.startswith(("Core was generated", "Program terminated", "#", "[Current"))]
    kept += [line for line in stacks.splitlines() if not GDB_ADVICE.search(line)]
    return "\n".join(kept)


def top_frames(stacks, count=TOP_FRAMES):
    """The crashing thread's first frames, shortened to "function (library)".

    Frames up to "<signal handler called>" (faulthandler re-raising the
    signal) are left out: the frame after it is where the fault happened.
    """
    section = stacks.split("=== crashing thread ===", 1)[-1].split("=== all threads ===")[0]
    return _frames(section.split("<signal handler called>", 1)[-1], count)


def main_thread_frames(stacks, pid, count=2 * TOP_FRAMES):
    """The first frames of the process's main thread (its LWP is the pid), shortened."""
    section = stacks.split("=== all threads ===", 1)[-1]
    match = re.search(rf"\nThread \d+ \(Thread 0x[0-9a-f]+ \(LWP {pid}\)\):\n(.*?)(?:\n\n|$)",
                      section, re.S)
    return _frames(match.group(1), count) if match else []


def _frames(section, count):
    frames = []
    for line in section.splitlines():
        match = re.match(r"#\d+\s+(?:0x[0-9a-f]+ in )?(.*?)(?: (?:from|at) (\S+))?$", line)
        if not match:
            continue
        # "ns::(anonymous namespace)::Class::method(arg types) (...)" -> "ns::{anon}::Class::method"
        name = match.group(1).replace("(anonymous namespace)", "{anon}").split("(")[0].strip()
        where = os.path.basename(match.group(2).split(":")[0]) if match.group(2) else ""
        frames.append(f"{name} ({where})" if where else name)
        if len(frames) == count:
            break
    return frames


def python_stacks(output, limit=12000):
    """faulthandler's reports ("Fatal Python error ...", every thread's Python stack)."""
    reports = []
    for match in FATAL.finditer(output):
        reports.append(output[max(0, match.start() - 200):match.start() + limit])
    return reports


def alarm_lines(output):
    return [line for line in output.splitlines() if ALARM.search(line)]


# ------------------------------------------------------------------------ jobs
@dataclasses.dataclass
class JobResult:
    index: int
    configuration: str
    kind: str
    seconds: float
    returncode: int
    details: dict


def classify(returncode, timed_out, cores, output):
    if timed_out:
        return "hang"
    if cores or FATAL.search(output) or returncode < 0 or returncode >= 128:
        return "crash"
    if returncode != 0:
        return "crash" if EXIT_BY_SIGNAL.search(output) else "error"
    return "false_alarm" if alarm_lines(output) else "ok"


def run_job(index, configuration, job_timeout, peer_timeout, keep_dirs):
    """Run one job in a fresh directory; return its `JobResult` (with stacks for crashes)."""
    directory = os.path.realpath(tempfile.mkdtemp(prefix=f"tfdist-stress-{index}-"))
    env = dict(os.environ, PYTHONFAULTHANDLER="1", TF_CPP_MIN_LOG_LEVEL="2",
               TFDIST_TIMEOUT=str(peer_timeout), PYTHONUNBUFFERED="1")
    for stale in ("TF_CONFIG", "HOROVOD_RANK", "TFDIST_RANK", "TFDIST_ROLE"):
        env.pop(stale, None)
    log_path = os.path.join(directory, "output.log")
    start = time.monotonic()
    timed_out = False
    with open(log_path, "wb") as log:
        launcher = subprocess.Popen(configuration.command(peer_timeout), cwd=directory, env=env,
                                    stdin=subprocess.DEVNULL, stdout=log,
                                    stderr=subprocess.STDOUT, preexec_fn=_enable_core_dumps)
        try:
            returncode = launcher.wait(job_timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            # Stacks of the stuck processes: faulthandler prints them on SIGABRT, and the
            # core gives the native ones. The launcher is left out (its stack is no news).
            signal_all([p for p in processes_in(directory) if p != launcher.pid], signal.SIGABRT)
            try:
                returncode = launcher.wait(ABORT_GRACE_SECONDS)
            except subprocess.TimeoutExpired:
                launcher.kill()
                returncode = launcher.wait()
        seconds = time.monotonic() - start
        leftovers = processes_in(directory)
        signal_all(leftovers, signal.SIGKILL)
    with open(log_path, "rb") as f:
        output = f.read().decode(errors="replace")
    cores = sorted(glob.glob(os.path.join(directory, "**", "core*"), recursive=True))
    kind = classify(returncode, timed_out, cores, output)
    details = {"leftover_processes": len(leftovers)} if leftovers else {}
    if kind in ("crash", "hang"):
        details["cores"] = []
        for core in cores:
            stacks = native_stacks(core)
            process = os.path.basename(os.path.dirname(core))
            details["cores"].append({
                "process": process, "top_frames": top_frames(stacks),
                "main_thread_frames": main_thread_frames(stacks, process.rsplit("-", 1)[-1]),
                "native_stacks": stacks})
        details["python_stacks"] = python_stacks(output)
        details["output_tail"] = output[-6000:]
    elif kind == "false_alarm":
        details["alarm_lines"] = alarm_lines(output)[:10]
    elif kind == "error":
        details["output_tail"] = output[-4000:]
    if keep_dirs and kind != "ok":
        logging.info("job %d (%s): kept %s", index, kind, directory)
        for core in cores:
            os.remove(core)  # cores are large; their stacks are kept
    else:
        shutil.rmtree(directory, ignore_errors=True)
    return JobResult(index, configuration.name, kind, round(seconds, 1), returncode, details)


# --------------------------------------------------------------------- report
KINDS = ("ok", "crash", "hang", "false_alarm", "error")


def summarize(results, settings, started):
    """The summary JSON (counts, crashing frames) and the full-stacks JSON."""
    totals = collections.Counter(r.kind for r in results)
    by_configuration = collections.defaultdict(collections.Counter)
    for r in results:
        by_configuration[r.configuration][r.kind] += 1
    problems, stacks = [], []
    for r in results:
        if r.kind == "ok":
            continue
        entry = {"job": r.index, "configuration": r.configuration, "kind": r.kind,
                 "seconds": r.seconds, "returncode": r.returncode}
        if "cores" in r.details:
            entry["crashed_processes"] = [
                {k: c.get(k, []) for k in ("process", "top_frames", "main_thread_frames")}
                for c in r.details["cores"]]
            first = r.details["python_stacks"][:1]
            entry["python_stack_head"] = first[0][:1500].splitlines() if first else []
            stacks.append({"job": r.index, "configuration": r.configuration, "kind": r.kind,
                           "cores": r.details["cores"],
                           "python_stacks": r.details["python_stacks"],
                           "output_tail": r.details["output_tail"]})
        for key in ("alarm_lines", "leftover_processes"):
            if key in r.details:
                entry[key] = r.details[key]
        if r.kind == "error":
            entry["output_tail"] = r.details["output_tail"][-1500:].splitlines()
        problems.append(entry)
    summary = {
        "description": "short multi-process jobs of every strategy/backend/launcher on an "
                       "oversubscribed CPU (see benchmarks/stress.py); kinds: " + ", ".join(KINDS),
        "started": started,
        "settings": settings,
        "totals": {"jobs": len(results), **{k: totals.get(k, 0) for k in KINDS}},
        "by_configuration": {name: {"jobs": sum(c.values()), **{k: c.get(k, 0) for k in KINDS}}
                             for name, c in sorted(by_configuration.items())},
        "mean_job_seconds": round(sum(r.seconds for r in results) / max(1, len(results)), 1),
        "problems": problems,
        "jobs": [[r.index, r.configuration, r.kind, r.seconds, r.returncode] for r in results],
    }
    return summary, {"crashes_and_hangs": stacks}


def redact(text):
    """`text` with this machine's paths (repository, interpreter, temp, home) as placeholders.

    Stacks and outputs name files by absolute path; results are committed,
    and where they ran is not part of them.
    """
    places = {os.path.dirname(HERE): "<repo>", sys.prefix: "<venv>",
              sys.base_prefix: "<python>", os.path.realpath(sys.base_prefix): "<python>",
              tempfile.gettempdir(): "<tmp>", os.path.expanduser("~"): "~"}
    for path in sorted((p for p in places if len(p) > 1), key=len, reverse=True):
        text = text.replace(path, places[path])
    return text


def write_json(path, data):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(redact(json.dumps(data, indent=1)) + "\n")
    os.replace(tmp, path)


def write_all(out, summary, stacks):
    write_json(out, summary)
    write_json(stacks_path(out), stacks)


def stacks_path(out):
    root, ext = os.path.splitext(out)
    return f"{root}_crashes{ext}"


def load_results(out):
    """The jobs recorded in `out` (and its stacks file), to continue an interrupted run."""
    with open(out) as f:
        summary = json.load(f)
    with open(stacks_path(out)) as f:
        stacks = {entry["job"]: entry for entry in json.load(f)["crashes_and_hangs"]}
    problems = {entry["job"]: entry for entry in summary["problems"]}
    results = []
    for index, configuration, kind, seconds, returncode in summary["jobs"]:
        details = {k: v for k, v in problems.get(index, {}).items()
                   if k in ("alarm_lines", "leftover_processes")}
        if kind == "error":
            details["output_tail"] = "\n".join(problems[index]["output_tail"])
        if index in stacks:
            details.update({k: stacks[index][k] for k in ("cores", "python_stacks",
                                                           "output_tail")})
        results.append(JobResult(index, configuration, kind, seconds, returncode, details))
    return results, summary["started"]


# ----------------------------------------------------------------------- main
def environment():
    """`tfdist-bench`'s environment record (versions, CPUs), read in a child process.

    The harness itself never imports TensorFlow: it forks launchers with a
    preexec_fn, which is unsafe once a process runs TensorFlow's threads.
    """
    code = ("import json; from benchmarks.harness import environment; "
            "print(json.dumps(environment()))")
    done = subprocess.run([sys.executable, "-c", code], cwd=os.path.dirname(HERE),
                          capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def select(only):
    if not only:
        return list(CONFIGURATIONS)
    names = only.split(",")
    known = {c.name: c for c in CONFIGURATIONS}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"unknown configuration(s) {unknown}; known: {sorted(known)}")
    return [known[n] for n in names]


def schedule(configurations, jobs, seed):
    """`jobs` configurations: every configuration once per round, rounds shuffled."""
    rng = random.Random(seed)
    order = []
    while len(order) < jobs:
        round_ = list(configurations)
        rng.shuffle(round_)
        order.extend(round_)
    return order[:jobs]


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m benchmarks.stress",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=120, help="number of jobs (default 120)")
    parser.add_argument("--only", default="", help="comma-separated configuration names")
    parser.add_argument("--busy", type=int, default=os.cpu_count() or 2,
                        help="busy-loop processes beside the jobs (default: one per CPU)")
    parser.add_argument("--job-timeout", type=float, default=240.0,
                        help="seconds before a job counts as a hang (default 240)")
    parser.add_argument("--peer-timeout", type=float, default=90.0,
                        help="tfdist's own --timeout for every wait on a peer (default 90)")
    parser.add_argument("--out", default=DEFAULT_OUT, help="summary JSON path")
    parser.add_argument("--seed", type=int, default=0, help="order of the configurations")
    parser.add_argument("--keep-dirs", action="store_true",
                        help="keep the directories (outputs) of jobs that were not ok (logged)")
    parser.add_argument("--resume", action="store_true",
                        help="keep the jobs already recorded in --out and run --jobs more")
    parser.add_argument("--list", action="store_true", help="list the configurations and exit")
    args = parser.parse_args(argv)
    logging.set_verbosity(logging.INFO)
    if args.list:
        for c in CONFIGURATIONS:
            print(f"{c.name:32s} {' '.join(c.command(args.peer_timeout)[1:])}")
        return 0
    if shutil.which("gdb") is None:
        logging.warning("gdb not found: crashes will be counted without native stacks")
    results = []
    started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    if args.resume and os.path.exists(args.out):
        results, started = load_results(args.out)
    order = schedule(select(args.only), args.jobs, args.seed + len(results))
    settings = {k: getattr(args, k) for k in ("only", "busy", "job_timeout", "peer_timeout",
                                              "seed")}
    settings["environment"] = environment()
    busy = BusyLoops(args.busy)
    try:
        for configuration in order:
            result = run_job(len(results), configuration, args.job_timeout, args.peer_timeout,
                             args.keep_dirs)
            results.append(result)
            frames = [c["top_frames"][:3] for c in result.details.get("cores", [])]
            logging.info("job %d %-30s %-11s %5.1f s rc=%d %s", result.index,
                         configuration.name, result.kind, result.seconds, result.returncode,
                         frames or result.details.get("alarm_lines", [""])[:1])
            write_all(args.out, *summarize(results, settings, started))
    finally:
        busy.stop()
    totals = summarize(results, settings, started)[0]["totals"]
    logging.info("stress: %s", ", ".join(f"{k} {v}" for k, v in totals.items()))
    return 0 if totals["ok"] == totals["jobs"] else 1


if __name__ == "__main__":
    sys.exit(main())
