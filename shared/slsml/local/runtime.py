"""The local runtime: embedded cloud + function host, as one context manager."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from types import TracebackType
from typing import TypedDict

from slsml.aws.storage import ObjectStore
from slsml.local import lifecycle
from slsml.local.accelerator import checked_accelerators
from slsml.local.cloud import LIFECYCLE, EmbeddedCloud, LocalDeployment, deployment_in_use
from slsml.local.host import FunctionHost, leave_out_main, start_preloading
from slsml.pipeline.services import Services
from slsml.spec.config import TrainingSpec
from slsml.spec.deployment import DEFAULT_FUNCTIONS, checked_settings
from slsml.spec.limits import RunLimits

POOL_ENV = "SLSML_POOL"
# A pool slot is one warm Worker, Reducer and ReduceLauncher process each. What each adds to the machine's
# memory (its proportional set size: the pages it shares with its siblings, TensorFlow's among them, counted
# once among them all), measured after a 20-iteration demo-sized run: 154 MB for a Worker, 108 MB for a
# Reducer, 106 MB for a ReduceLauncher (each 310-420 MB resident, most of it shared). Where there is no fork
# server (Windows) each process imports TensorFlow itself, and a Worker was measured at 700 MB: set the pool.
WARM_WORKER_MB = 155
WARM_REDUCER_MB = 110
WARM_REDUCE_LAUNCHER_MB = 110
SLOT_MB = WARM_WORKER_MB + WARM_REDUCER_MB + WARM_REDUCE_LAUNCHER_MB
PROCESSES_PER_CORE = 2  # an invocation also waits on the embedded cloud: two per core keep the cores busy
MEMORY_SHARE = 0.5  # of the memory available when the runtime starts
# how long leaving the runtime waits for the host's threads to end once the cloud has stopped (each ends as its
# request to the stopped cloud fails, after the retries its client makes)
HOST_JOIN_S = 10.0


def _available_memory_mb() -> int:
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) // 1024
    except OSError:
        pass
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 2**20


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def default_pool() -> int:
    """The most warm processes per function: ``SLSML_POOL`` if set, else what this machine holds:
    ``PROCESSES_PER_CORE`` per core, and no more pool slots than ``MEMORY_SHARE`` of the available
    memory holds."""
    if os.environ.get(POOL_ENV):
        return int(os.environ[POOL_ENV])
    by_memory = int(MEMORY_SHARE * _available_memory_mb()) // SLOT_MB
    return max(1, min(PROCESSES_PER_CORE * _cores(), by_memory))


class Sized(TypedDict):
    workers: int
    reducers: int
    stages: int


def sized_for(spec: TrainingSpec, parallel: int = 1) -> Sized:
    """``LocalRuntime``'s ``workers``, ``reducers`` and ``stages`` for ``parallel`` runs of ``spec`` at once: warm
    processes for the most workers each may scale to, every stage of each."""
    return Sized(
        workers=parallel * spec.asked_workers(), reducers=parallel * spec.reducers, stages=spec.pipeline_stages
    )


class LocalRuntime:
    """``with LocalRuntime(workers=4, reducers=2) as local: ...`` runs the pipeline on this machine.

    ``workers``/``reducers`` are the most invocations of each a run can have at once (a worker in ``stages``
    pipeline stages is that many Worker invocations), within a deployment's reserved concurrency
    (``DEFAULT_FUNCTIONS``); ``sized_for`` sizes them for a run's spec. ``pool`` bounds every function's warm
    processes (default ``default_pool()``), so a run of any number of workers runs on at most ``pool`` Worker
    processes: the messages beyond wait in their queue. Each function has processes of its own, so the watchdog and
    the dead-letter reader always find one, however busy the fleet. ``limits`` are what any one run may ask for, as
    a deployment's (``RunLimits``), enforced by the same pipeline code. ``memory_mb`` sizes functions (function →
    MB) otherwise than a default deployment (``DEFAULT_FUNCTIONS``), as its ``functions.<name>.memory_mb`` settings
    do: a process whose memory passes its function's is killed, as Lambda kills its container
    (``slsml.local.memory``); ``timeouts_s`` (function → s) so too as its ``functions.<name>.timeout_s`` do: an
    invocation is ended at its function's, and the Worker's and Reducer's are the run limits'
    ``function_timeouts_s``. ``accelerator_gib`` (``{"worker": GiB}``) gives each warm Worker process a logical GPU
    of that memory, as its ``functions.worker.accelerator_gib`` does (``slsml.local.accelerator``); refused where
    there is no GPU. ``duplicate_deliveries`` delivers every SNS message twice (an at-least-once test switch).
    """

    def __init__(
        self,
        workers: int = 4,
        reducers: int = 2,
        pool: int | None = None,
        stages: int = 1,
        duplicate_deliveries: bool = False,
        log_dir: Path = Path(".slsml/logs"),
        tf_threads: int = 1,
        limits: RunLimits | None = None,
        memory_mb: dict[str, int] | None = None,
        timeouts_s: dict[str, int] | None = None,
        accelerator_gib: dict[str, int] | None = None,
    ) -> None:
        self.cloud = EmbeddedCloud()
        pool = pool or default_pool()
        wanted = {
            "work_launcher": 1,
            "worker": workers * stages,
            "reduce_launcher": workers,  # one report per worker: none waits for another's
            "reducer": reducers,
            "merger": 1,
            "watchdog": 1,
            "run_starter": 1,
            "dead_letters": 1,
        }
        reserved = {name: DEFAULT_FUNCTIONS[name].reserved_concurrency or n for name, n in wanted.items()}
        self.concurrency = {function: min(n, reserved[function], pool) for function, n in wanted.items()}
        self.memory_mb = checked_settings("memory_mb", memory_mb or {}, self.concurrency)
        self.timeouts_s = checked_settings("timeout_s", timeouts_s or {}, self.concurrency)
        accelerators = checked_settings("accelerator_gib", accelerator_gib or {}, self.concurrency)
        self.accelerator_gib = checked_accelerators(accelerators, self.concurrency)
        self.limits = self._deployed(limits or RunLimits()).with_timeouts(self.timeouts_s)
        self.duplicate_deliveries = duplicate_deliveries
        self.log_dir = log_dir
        self.tf_threads = tf_threads
        self.deployment: LocalDeployment | None = None
        self._host: FunctionHost | None = None
        self._services: Services | None = None
        self._restore_main: Callable[[], None] | None = None
        self._in_use = ExitStack()  # this process's clients pointed at the cloud, until it stops

    @property
    def services(self) -> Services:
        """The clients of the embedded cloud's services, once the runtime is entered."""
        if self._services is None:
            raise RuntimeError("the local runtime is not started: use it as `with LocalRuntime(...) as local:`")
        return self._services

    @property
    def host(self) -> FunctionHost:
        """The warm function processes, once the runtime is entered."""
        if self._host is None:
            raise RuntimeError("the local runtime is not started: use it as `with LocalRuntime(...) as local:`")
        return self._host

    @contextmanager
    def limited(self, limits: RunLimits) -> Iterator[LocalRuntime]:
        """The block's runs are those of a deployment with ``limits`` (its function timeouts among them): started
        and checked against them, and their stage functions' invocations ended at the timeouts they name."""
        before = self.limits
        self._limit(limits)
        try:
            yield self
        finally:
            self._limit(before)

    @contextmanager
    def resized(self, memory_mb: dict[str, int]) -> Iterator[LocalRuntime]:
        """The block's invocations run with these functions' memory (function → MB), in fresh processes, as after
        a deployment's update of their ``memory_mb``; the sizes before are restored after it."""
        before = {function: self.host.memory_mb[function] for function in memory_mb if function in self.host.memory_mb}
        self.host.resize(memory_mb)
        try:
            yield self
        finally:
            self.host.resize(before)

    def expire(self, now: float) -> lifecycle.Expired:
        """Apply the bucket's lifecycle rules and the table's TTL at ``now`` (epoch seconds), deleting as the
        lifecycle's identity: S3's expirations are no principal's requests, and the bucket's policy lets it delete
        what they would."""
        deleter = ObjectStore(self.cloud.client("s3", LIFECYCLE), self.services.store.bucket)
        return lifecycle.expire(self.services, now, deleter)

    @property
    def worker_memory_mb(self) -> int:
        """The Worker's memory: a run's micro-batches fit it."""
        return self.memory_mb.get("worker", DEFAULT_FUNCTIONS["worker"].memory_mb)

    def _deployed(self, limits: RunLimits) -> RunLimits:
        """``limits`` with this deployment's worker: its memory, its accelerator and its warm processes."""
        return (
            limits.with_worker_memory(self.worker_memory_mb)
            .with_worker_accelerator(self.accelerator_gib.get("worker"))
            .with_worker_concurrency(self.concurrency["worker"])
        )

    def _limit(self, limits: RunLimits) -> None:
        limits = self._deployed(limits)
        self.limits = self.services.limits = limits
        self.host.set_limits(limits)

    def begin(self) -> LocalRuntime:
        """Start, in processes of their own, what takes longest to get ready: the function processes'
        imports (TensorFlow's among them) and the embedded cloud's server. This process goes on meanwhile
        (a command loads TensorFlow and the model); entering the runtime waits for them. Both end with this
        process if it is never entered."""
        if self._restore_main is None:
            self._restore_main = leave_out_main()
        start_preloading()
        self.cloud.launch()
        return self

    def __enter__(self) -> LocalRuntime:
        self.begin()  # the function processes import while the cloud starts
        self.cloud.start()
        try:
            self.deployment = self.cloud.provision()
            self.deployment.run_limits = self.limits.model_dump_json()
            self._in_use.enter_context(deployment_in_use(self.deployment))
            self._services = Services.from_names(
                self.deployment.bucket,
                self.deployment.table,
                self.deployment.topic_arns,
                self.deployment.state_machine_arn,
                self.deployment.deadline_queue_url,
                self.limits,
            )
            self._host = FunctionHost(
                self.deployment,
                self.concurrency,
                self.log_dir,
                self.duplicate_deliveries,
                self.tf_threads,
                memory_mb=self.memory_mb,
                timeouts_s=self.timeouts_s,
                accelerator_gib=self.accelerator_gib,
            )
            self._host.start()
        except BaseException:
            self._in_use.close()
            self.cloud.stop()
            raise
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        if self._host is not None:
            self._host.stop()
        self._in_use.close()
        self.cloud.stop()
        if self._host is not None:
            self._host.join(HOST_JOIN_S)
        if self._restore_main is not None:
            self._restore_main()
            self._restore_main = None
