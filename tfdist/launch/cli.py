"""`tfdist-run`: start a multi-process tfdist job on this machine.

    tfdist-run -np N [--num-servers K] [--timeout S] [--port-base P] [--[no-]horovod] [--[no-]mpi]
               [--verbose] [--keep-going] [--max-restarts R]
               [--min-np A] [--max-np B] [--host-discovery-script S] [--slots-per-host K]
               [--elastic-timeout S] [--reset-limit R]
               [--profile DIR [--profile-steps A:B]]
               python train.py args...

Starts N training processes (ranks 0 .. N-1) and K parameter-server processes,
each with the environment `tfdist.process_setup.cluster.discover` reads. Every flag can also
be given as an environment variable (`TFDIST_NP`, `TFDIST_NUM_SERVERS`,
`TFDIST_TIMEOUT`, `TFDIST_PORT_BASE`, `TFDIST_HOROVOD=1`, `TFDIST_MAX_RESTARTS`, the
elastic ones in `tfdist.env_vars`). When Horovod is installed (or with `--horovod`; not with `--no-horovod`) the ranks are also
a Horovod job (Gloo), as under `horovodrun --gloo`: `RingAllReduceStrategy(backend="auto")`
then takes Horovod's engine, the faster on big gradients (`tfdist.comm.engines`),
and `backend="horovod"` and `tfdist.horovod.keras` work. The exit code is 0 when every rank
exits 0, otherwise that of the first process to fail (the others are
terminated and the failing rank is named). With `--max-restarts R` a failed
job is started again, whole, up to R times (torchrun's semantics): new
ports, `TFDIST_RESTART_COUNT` set to the restart's number, and the ranks
resume from their `keras.callbacks.BackupAndRestore` backup, if the script
has one, else from the beginning; a job the launcher itself was told to
stop (SIGINT/SIGTERM) is not restarted: it ends with the ranks' code, 42
when they backed up on the preemption notice the launcher relayed to them
(`tfdist.fault_tolerance.preemption`). With `--min-np`, `--max-np` or
`--host-discovery-script` (Horovod Elastic's flags and discovery format) the
job is elastic: it goes on with fewer processes when one is lost and changes
size at an agreed step when the discovered slots change
(`tfdist.launch.elastic_job`). When Open MPI's mpirun is installed (or with `--mpi`;
not with `--no-mpi`, elastic or `--keep-going` jobs, nor by default with more ranks than
CPUs: `tfdist.launch.mpi_job.fits_the_cpus`) the training processes are started
through one mpirun, as one MPI job (`tfdist.launch.mpi_job`): "auto" then takes
Open MPI's own collectives (`tfdist.comm.mpi`), the fastest engine on one host.
TensorFlow's start-up notices
and repeated copies of a warning are left out of the output unless
`--verbose` (`tfdist.launch.output_filter`). `--profile DIR` profiles
training batches A..B on every rank into `DIR/rank_<k>` and, when the job
succeeded, merges them into one timeline (`tfdist.profiling.timeline`).
"""

import argparse
import os
import shutil
import subprocess
import sys
import tempfile

from tfdist.env_vars import Foreign
from tfdist import env_vars
from tfdist.fault_tolerance import restarts
from tfdist.process_setup import cluster as cluster_lib
from tfdist.process_setup import job_secret, joined_strategy
from tfdist.comm import ports as ports_lib
from tfdist.launch import (elastic_job, gloo_rendezvous_server, host_discovery,
                           listening_sockets, mpi_job, processes)
from tfdist.launch.output_filter import OutputFilter
from tfdist.profiling import names as profiling_names
from tfdist.profiling import timeline

HOST = ports_lib.LOOPBACK  # every process of a tfdist-run job runs on this machine
# The secret of the jobs this launcher starts (`tfdist.process_setup.job_secret`): one per
# launcher, so that restarts and elastic resizes keep it; TFDIST_SECRET, when set, is kept.
JOB_SECRET = job_secret.new_secret()


def build_parser():
    parser = argparse.ArgumentParser(
        prog="tfdist-run",
        description="Run a tfdist training script as several local processes.",
    )
    parser.add_argument(
        "-np", "--num-proc", dest="num_proc", type=int,
        default=env_vars.NP.integer(default=1),
        help=f"number of training processes (env {env_vars.NP}, default 1)",
    )
    parser.add_argument(
        "-H", "--hosts", metavar="HOST:SLOTS,...", default=env_vars.HOSTS.get(),
        help="start the processes on these hosts, as horovodrun's -H: where one is another "
             "machine, through Open MPI's `mpirun -H` (which reaches them by ssh); this "
             f"machine alone: as without -H (env {env_vars.HOSTS}; default: this machine)")
    parser.add_argument(
        "--num-servers", type=int, default=env_vars.NUM_SERVERS.integer(default=0),
        help=f"number of dedicated parameter-server processes (env {env_vars.NUM_SERVERS})",
    )
    parser.add_argument(
        "--timeout", type=float,
        default=float(env_vars.TIMEOUT.get(default=str(cluster_lib.DEFAULT_TIMEOUT_SECONDS))),
        help=f"seconds any rank may wait for a peer (env {env_vars.TIMEOUT}, default 300)",
    )
    parser.add_argument(
        "--port-base", type=int,
        default=env_vars.PORT_BASE.integer(),
        help=f"first of the consecutive ports to use (env {env_vars.PORT_BASE}; default: free "
             "ports)",
    )
    parser.add_argument(
        "--port-range", metavar="FIRST-LAST", default=env_vars.PORT_RANGE.get(),
        help="take every port the job listens on from this range (a firewalled cluster): the "
             "processes' ports, and mpirun's out-of-band and TCP transports (env "
             f"{env_vars.PORT_RANGE}; default: any free port)")
    parser.add_argument(
        "--network-interface", metavar="NAME", default=env_vars.NETWORK_INTERFACE.get(),
        help="in a job across hosts, listen and reach peers on this interface, as "
             "horovodrun's --network-interface (env "
             f"{env_vars.NETWORK_INTERFACE}; default: the host name's address). A job on "
             "this machine alone listens on loopback")
    horovod = parser.add_mutually_exclusive_group()
    horovod.add_argument(
        "--horovod", action="store_true", default=None,
        help="make the ranks a Horovod (Gloo) job, as horovodrun would, and fail if Horovod "
             f"is not installed (env {env_vars.HOROVOD}=1). Default: when Horovod is "
             "installed, so that RingAllReduceStrategy(backend=\"auto\") can take its "
             "engine, the faster one on big gradients")
    horovod.add_argument(
        "--no-horovod", dest="horovod", action="store_false",
        help=f"do not start Horovod's Gloo rendezvous (in an MPI job a Horovod built with MPI "
             "still runs on MPI, as under mpirun): \"auto\" takes Open MPI's or TensorFlow's "
             "collectives "
             f"(env {env_vars.HOROVOD}=0)")
    mpi = parser.add_mutually_exclusive_group()
    mpi.add_argument(
        "--mpi", action="store_true", default=None,
        help="start the ranks as one MPI job through Open MPI's mpirun (tfdist.launch.mpi_job), "
             "so that RingAllReduceStrategy(backend=\"auto\") takes the MPI engine, and fail "
             f"if mpirun is missing (env {env_vars.MPI}=1). Default: when Open MPI's mpirun is "
             "installed, except for elastic and --keep-going jobs")
    mpi.add_argument(
        "--no-mpi", dest="mpi", action="store_false",
        help=f"start the ranks one by one, without mpirun (env {env_vars.MPI}=0)")
    parser.add_argument(
        "--verbose", action="store_true",
        default=env_vars.VERBOSE.flag(),
        help="show TensorFlow's start-up notices and every rank's copy of a warning, and list "
             f"every socket the job's processes listen on (env {env_vars.VERBOSE}=1)",
    )
    parser.add_argument(
        "--keep-going", action="store_true",
        default=env_vars.KEEP_GOING.flag(),
        help="when a worker fails, let the other workers finish (asynchronous parameter "
             f"server); the job still exits with the failure's code (env {env_vars.KEEP_GOING}=1)",
    )
    parser.add_argument(
        "--max-restarts", type=int,
        default=env_vars.MAX_RESTARTS.integer(),
        help="start a failed job again, all of it, up to this many times; the ranks resume "
             f"from their BackupAndRestore backup (env {env_vars.MAX_RESTARTS}, default 0; "
             "elastic: unbounded)")
    elastic = parser.add_argument_group(
        "elastic (Horovod Elastic's flags; any of them makes the job elastic)")
    elastic.add_argument(
        "--min-np", "--min-num-proc", dest="min_np", type=int,
        default=env_vars.MIN_NP.integer(),
        help="the fewest processes the job goes on with after a loss; below it, it waits for "
             f"slots (env {env_vars.MIN_NP}, default -np)")
    elastic.add_argument(
        "--max-np", "--max-num-proc", dest="max_np", type=int,
        default=env_vars.MAX_NP.integer(),
        help="the most processes the job grows to when slots are discovered (env "
             f"{env_vars.MAX_NP}; default: the slots, or -np without a discovery script)")
    elastic.add_argument(
        "--host-discovery-script", default=env_vars.HOST_DISCOVERY_SCRIPT.get(),
        help="a command printing 'host:slots' lines (Horovod's format), run every second: a "
             "changed count resizes the job at an agreed step; the processes run on this "
             f"machine (env {env_vars.HOST_DISCOVERY_SCRIPT})")
    elastic.add_argument(
        "--slots-per-host", type=int, default=env_vars.SLOTS_PER_HOST.integer(default=1),
        help="slots of a discovered host printed without ':slots' (env "
             f"{env_vars.SLOTS_PER_HOST}, default 1)")
    elastic.add_argument(
        "--elastic-timeout", type=float,
        default=float(env_vars.ELASTIC_TIMEOUT.get(
            default=str(elastic_job.DEFAULT_ELASTIC_TIMEOUT_SECONDS))),
        help="seconds to wait for --min-np slots, or for the ranks to take a resize request "
             f"(env {env_vars.ELASTIC_TIMEOUT}, default 600)")
    elastic.add_argument(
        "--reset-limit", type=int, default=env_vars.RESET_LIMIT.integer(),
        help="the most restarts of an elastic job, resizes and failures (env "
             f"{env_vars.RESET_LIMIT}, default unbounded)")
    parser.add_argument(
        "--profile", metavar="DIR", default=env_vars.PROFILE_DIR.get(),
        help="profile every rank's training batches --profile-steps with TensorFlow's profiler "
             "into DIR/rank_<k> (runs of `tensorboard --logdir DIR`), then merge the ranks' "
             f"communication into DIR/{profiling_names.TIMELINE_FILE} and "
             f"DIR/{profiling_names.OVERLAP_FILE} (env {profiling_names.PROFILE_DIR_ENV})")
    parser.add_argument(
        "--profile-steps", metavar="A:B",
        default=env_vars.PROFILE_STEPS.get(default=profiling_names.DEFAULT_PROFILE_STEPS),
        help="training batches to profile, counted from 1 in each fit, inclusive "
             f"(env {profiling_names.PROFILE_STEPS_ENV}, "
             f"default {profiling_names.DEFAULT_PROFILE_STEPS})")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the program and its arguments")
    return parser


def validate(args, parser):
    if args.num_proc < 1:
        parser.error(f"-np must be >= 1. Got: {args.num_proc}")
    if args.num_servers < 0:
        parser.error(f"--num-servers must be >= 0. Got: {args.num_servers}")
    if args.timeout <= 0:
        parser.error(f"--timeout must be positive. Got: {args.timeout}")
    if args.max_restarts is not None and args.max_restarts < 0:
        parser.error(f"--max-restarts must be >= 0. Got: {args.max_restarts}")
    validate_elastic(args, parser)
    if args.command and args.command[0] == "--":
        args.command = args.command[1:]
    if not args.command:
        parser.error("no command given (e.g. tfdist-run -np 2 python train.py)")
    try:
        ports_lib.parse_port_range(args.port_range)
    except ValueError as error:
        parser.error(f"--port-range: {error}")
    if args.port_range and args.port_base is not None:
        parser.error("--port-range and --port-base cannot go together: give one")
    if args.network_interface:
        try:
            ports_lib.interface_address(args.network_interface)
        except ValueError as error:
            parser.error(f"--network-interface: {error}")
    validate_hosts(args, parser)
    if args.mpi and args.keep_going:
        parser.error("--mpi cannot go with --keep-going: mpirun ends every rank when one fails")
    if args.mpi and mpi_job.unavailable_reason():
        parser.error(f"--mpi: {mpi_job.unavailable_reason()}")
    try:
        profiling_names.parse_profile_steps(args.profile_steps)
    except ValueError as error:
        parser.error(f"--profile-steps: {error}")


def validate_hosts(args, parser):
    """`-H`: Horovod's format; enough slots; and, where a host is another machine, a job
    mpirun can start there (`args.remote_hosts` says which)."""
    args.remote_hosts = []
    if not args.hosts:
        return
    try:
        slots = host_discovery.parse(args.hosts.replace(",", "\n"), 1)
    except ValueError as error:
        parser.error(f"-H: {error}")
    if not slots:
        parser.error(f"-H names no host. Got: {args.hosts!r}")
    if sum(slots.values()) < args.num_proc:
        parser.error(f"-H offers {sum(slots.values())} slots for {args.num_proc} processes "
                     f"(-np): {args.hosts}")
    args.remote_hosts = sorted(h for h in slots if not host_discovery.is_this_machine(h))
    if not args.remote_hosts:
        return
    where = f"-H names other machines ({', '.join(args.remote_hosts)})"
    if elastic_job.is_elastic(args):
        parser.error(f"{where}: an elastic tfdist-run starts its processes on this machine; "
                     "for an elastic job across machines use horovodrun")
    if mpi_job.unavailable_reason():
        parser.error(f"{where}: tfdist-run starts processes there through Open MPI's mpirun "
                     f"-H, which it cannot run here ({mpi_job.unavailable_reason()}); use "
                     "horovodrun -H, srun or TF_CONFIG")
    if args.mpi is False or args.keep_going or args.num_servers:
        parser.error(f"{where}: tfdist-run starts processes there through one mpirun, which "
                     "cannot go with --no-mpi, --keep-going or --num-servers (dedicated "
                     "servers on other machines: TF_CONFIG 'ps' tasks)")
    args.hosts = ",".join(f"{host}:{count}" for host, count in slots.items())


def validate_elastic(args, parser):
    """The elastic flags: Horovod's constraints, and what cannot go with them."""
    if not elastic_job.is_elastic(args):
        if args.max_restarts is None:
            args.max_restarts = 0
        return
    min_np = args.min_np if args.min_np is not None else args.num_proc
    if min_np < 1:
        parser.error(f"--min-np must be >= 1. Got: {min_np}")
    if min_np > args.num_proc:
        parser.error(f"--min-np ({min_np}) must be <= -np ({args.num_proc}): the job starts "
                     "with -np processes")
    if args.max_np is not None and args.max_np < args.num_proc:
        parser.error(f"--max-np ({args.max_np}) must be >= -np ({args.num_proc})")
    if args.slots_per_host < 1:
        parser.error(f"--slots-per-host must be >= 1. Got: {args.slots_per_host}")
    if args.elastic_timeout <= 0:
        parser.error(f"--elastic-timeout must be positive. Got: {args.elastic_timeout}")
    if args.reset_limit is not None and args.reset_limit < 0:
        parser.error(f"--reset-limit must be >= 0. Got: {args.reset_limit}")
    if args.mpi:
        parser.error("--mpi cannot go with an elastic job (--min-np/--max-np/"
                     "--host-discovery-script): mpirun starts a job of one fixed size")
    if args.keep_going:
        parser.error("--keep-going cannot go with an elastic job (--min-np/--max-np/"
                     "--host-discovery-script): a lost worker there restarts the job smaller")


def horovod_wanted(args):
    """True: `--horovod` (fail without Horovod); False: `--no-horovod`; None (the default):
    a Horovod job when Horovod is installed, else not."""
    if args.horovod is not None:
        return args.horovod
    if (env_vars.HOROVOD.get() or "").strip():
        return env_vars.HOROVOD.flag()
    return None if gloo_rendezvous_server.installed() else False


def mpi_wanted(args):
    """True: start the workers through mpirun (`--mpi`, or by default when Open MPI's mpirun
    is here, the job is neither elastic nor --keep-going and its ranks do not outnumber the
    CPUs); False: one by one."""
    wanted = args.mpi
    if wanted is None and (env_vars.MPI.get() or "").strip():
        wanted = env_vars.MPI.flag()
    if wanted is not None:
        return wanted
    return (mpi_job.unavailable_reason() is None and not args.keep_going
            and not elastic_job.is_elastic(args) and mpi_job.fits_the_cpus(args.num_proc))


def job_environments(num_proc, num_servers, timeout, port_list, base_env):
    """The environment of every process: [(label, env)], workers first."""
    workers = [f"{HOST}:{p}" for p in port_list[:num_proc]]
    servers = [f"{HOST}:{p}" for p in port_list[num_proc:]]
    common = dict(base_env)
    for stale in (Foreign.TF_CONFIG.name, Foreign.HOROVOD_RANK.name, Foreign.HOROVOD_SIZE.name,
                  profiling_names.PROFILE_DIR_ENV,
                  profiling_names.PROFILE_STEPS_ENV):
        common.pop(stale, None)
    common.update({
        cluster_lib.ENV_WORLD_SIZE: str(num_proc),
        cluster_lib.ENV_WORKER_ADDRESSES: ",".join(workers),
        cluster_lib.ENV_SERVER_ADDRESSES: ",".join(servers),
        cluster_lib.ENV_TIMEOUT: f"{timeout:g}",
        "PYTHONUNBUFFERED": "1",
    })
    envs = []
    for rank in range(num_proc):
        env = dict(common)
        env.update({
            cluster_lib.ENV_ROLE: cluster_lib.ROLE_WORKER,
            cluster_lib.ENV_RANK: str(rank),
            cluster_lib.ENV_LOCAL_RANK: str(rank),
        })
        envs.append((str(rank), env))
    for index in range(num_servers):
        env = dict(common)
        env.update({
            cluster_lib.ENV_ROLE: cluster_lib.ROLE_SERVER,
            cluster_lib.ENV_SERVER_INDEX: str(index),
        })
        env.pop(cluster_lib.ENV_RANK, None)
        envs.append((f"s{index}", env))
    return envs


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    validate(args, parser)
    if elastic_job.is_elastic(args):
        code = elastic_job.run(args, run_job)
        if args.profile and code == 0:
            code = merge_timeline(args.profile, args.profile_steps)
        return code
    restart = 0
    while True:
        code, group = run_job(args, restart)
        if (code == 0 or group is None or group.stopped_by_signal is not None
                or restart >= args.max_restarts):
            break
        restart += 1
        label, failed_code = group.failure or ("?", code)
        why = ("was preempted (exit code 42)" if failed_code == restarts.PREEMPTED_EXIT_CODE
               else f"exited with code {failed_code}")
        print(f"tfdist-run: {processes.describe(label)} {why}; "
              f"restarting the job ({restart} of {args.max_restarts} restarts) on new ports: "
              "its ranks resume from their BackupAndRestore backup if the script has one, "
              "else from the beginning", file=sys.stderr, flush=True)
    if args.profile and code == 0:
        code = merge_timeline(args.profile, args.profile_steps)
    return code


def run_job(args, restart, num_proc=None, extra_env=None, on_poll=None):
    """Start every process of the job once and wait for it: (exit code, its ProcessGroup, or
    None when the job could not start). `num_proc`: the workers (default `-np`; an elastic
    job's size), `extra_env`: added to every process's environment, `on_poll`: called while
    the processes run (`ProcessGroup.wait`)."""
    num_proc = num_proc or args.num_proc
    if getattr(args, "remote_hosts", None):
        return _run_across_hosts(args, restart, num_proc)
    try:
        held_ports = ports_lib.reserve_ports(num_proc + args.num_servers, HOST, args.port_base,
                                             ports_lib.parse_port_range(args.port_range))
    except OSError as e:
        print(f"tfdist-run: {e}", file=sys.stderr)
        return 1, None
    group = processes.ProcessGroup(output_filter=OutputFilter(enabled=not args.verbose))
    group.forward_signals()
    envs = job_environments(num_proc, args.num_servers, args.timeout,
                            [held.port for held in held_ports], os.environ)
    for _, env in envs:
        env[env_vars.RESTART_COUNT.name] = str(restart)
        env.setdefault(env_vars.SECRET.name, JOB_SECRET)
        if args.port_range:
            env[env_vars.PORT_RANGE.name] = args.port_range
        if args.network_interface:
            env[env_vars.NETWORK_INTERFACE.name] = args.network_interface
        env.update(extra_env or {})
        if args.profile:
            env[profiling_names.PROFILE_DIR_ENV] = os.path.abspath(args.profile)
            env[profiling_names.PROFILE_STEPS_ENV] = args.profile_steps
    use_mpi = mpi_wanted(args)
    job_dir = tempfile.mkdtemp(prefix="tfdist-job-")
    store = None
    try:
        store, code = _start_gloo_rendezvous(args, num_proc, envs, use_mpi)
        if code:
            return code, None
        joined_dir, exits_dir = os.path.join(job_dir, "joined"), os.path.join(job_dir, "exits")
        os.mkdir(joined_dir)
        os.mkdir(exits_dir)
        for _, env in envs:
            env[env_vars.JOINED_DIR.name] = joined_dir
        try:
            if use_mpi:
                rank_envs = [dict(env, **{env_vars.EXIT_REPORTS_DIR.name: exits_dir})
                             for _, env in envs[:num_proc]]
                group.start(mpi_job.LABEL, mpi_job.command(num_proc, args.command),
                            mpi_job.environment(rank_envs, args.port_range),
                            split_label=mpi_job.split_label,
                            reported_failures=lambda: mpi_job.rank_failures(exits_dir))
                workers = [mpi_job.LABEL]
            else:
                for label, env in envs[:num_proc]:
                    group.start(label, args.command, env)
                workers = [str(r) for r in range(num_proc)]
            for label, env in envs[num_proc:]:  # parameter servers, one by one
                group.start(label, args.command, env)
        except OSError as e:
            print(f"tfdist-run: cannot start {args.command[0]!r}: {e}", file=sys.stderr)
            group.terminate_all()
            return 127, None
        watchers = [on_poll] if on_poll else []
        watchers.append(joined_strategy.EarlyNotice(joined_dir, num_proc, _say))
        if args.verbose:
            watchers.append(listening_sockets.SocketReport(os.getpid(), _say))
        code = group.wait(workers=workers, keep_going=args.keep_going,
                          on_poll=lambda: [watch() for watch in watchers])
        if code == 0 and num_proc > 1 and not joined_strategy.any_joined(joined_dir):
            _say(joined_strategy.independent_processes_notice(num_proc))
        return code, group
    finally:
        if store is not None:
            store.shutdown()
            store.server_close()
        for held in held_ports:
            held.release()
        shutil.rmtree(job_dir, ignore_errors=True)


def _run_across_hosts(args, restart, num_proc):
    """`-H` naming other machines: one `mpirun -H` starts every rank where the hosts are
    (`mpi_job`); the ranks find each other as under any mpirun. (exit code, ProcessGroup)."""
    settings = {env_vars.TIMEOUT.name: f"{args.timeout:g}",
                env_vars.SECRET.name: os.environ.get(env_vars.SECRET.name) or JOB_SECRET,
                env_vars.RESTART_COUNT.name: str(restart), "PYTHONUNBUFFERED": "1"}
    if args.port_range:
        settings[env_vars.PORT_RANGE.name] = args.port_range
    if args.network_interface:
        settings[env_vars.NETWORK_INTERFACE.name] = args.network_interface
    if args.profile:
        settings[profiling_names.PROFILE_DIR_ENV] = os.path.abspath(args.profile)
        settings[profiling_names.PROFILE_STEPS_ENV] = args.profile_steps
    env = mpi_job.across_hosts_environment(os.environ, settings, args.network_interface)
    group = processes.ProcessGroup(output_filter=OutputFilter(enabled=not args.verbose))
    group.forward_signals()
    try:
        group.start(mpi_job.LABEL, mpi_job.command(num_proc, args.command, args.hosts,
                                                   tuple(sorted(settings))),
                    env, split_label=mpi_job.split_label)
    except OSError as e:
        print(f"tfdist-run: cannot start mpirun: {e}", file=sys.stderr)
        return 127, None
    watchers = [listening_sockets.SocketReport(os.getpid(), _say)] if args.verbose else []
    code = group.wait(workers=[mpi_job.LABEL],
                      on_poll=lambda: [watch() for watch in watchers])
    return code, group


def _say(line):
    print(f"tfdist-run: {line}", file=sys.stderr, flush=True)


def _start_gloo_rendezvous(args, num_proc, envs, use_mpi):
    """(Horovod's Gloo rendezvous server or None, exit code or 0): started on loopback when the
    job may run Horovod on Gloo - Horovod installed (or `--horovod`), and not an MPI job whose
    Horovod runs on MPI - its environment added to the ranks'."""
    horovod = horovod_wanted(args)
    if horovod is False or (horovod is None and use_mpi
                            and gloo_rendezvous_server.built_with_mpi()):
        return None, 0
    try:
        store, horovod_envs = gloo_rendezvous_server.start(num_proc, HOST)
    except RuntimeError as e:
        if horovod:  # asked for; by default, a job without Horovod
            print(f"tfdist-run: {e}", file=sys.stderr)
            return None, 1
        return None, 0
    for (_, env), extra in zip(envs, horovod_envs):
        env.update(extra)
    return store, 0


def merge_timeline(log_dir, steps):
    """Merge the ranks' profiles (`tfdist.profiling.timeline`, in a child: it loads TensorFlow)."""
    return subprocess.call([sys.executable, "-m", timeline.__name__, log_dir,
                            "--steps", steps])


if __name__ == "__main__":
    sys.exit(main())
