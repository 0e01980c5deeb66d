"""The function host: long-polls each function's queue and runs the real handler in its warm containers, each one
process (one import of the handler per process, like a warm Lambda container: ``slsml.local.containers``), with an
SNS-shaped event and a Lambda-like context. The processes are forked from a server process that imported TensorFlow
and the other libraries once (``slsml.local.preload``), so each starts in under a second. A poller takes no more
messages than its function has containers free: the others wait in the queue. Each process has its function's
memory setting (``AWS_LAMBDA_FUNCTION_MEMORY_SIZE``) and logs its pid once started; one whose memory passes it while
it runs an invocation is killed, as Lambda kills a container (``slsml.local.memory``): that invocation alone ends, and
a fresh container takes the killed one's place. Each invocation logs Lambda's REPORT line, its peak memory among
it. A failed invocation is retried by SQS, 1 s and then 2 s after it failed (Lambda retries an asynchronous event 1
and 2 minutes later); when its third try fails, the message goes to the function's DLQ at once. The host hands each
dead letter to the dead-letter reader
(``wiring.dead_letter_reader``, ``slsml.pipeline.steps.dead_letters``) in the shape its AWS dead-letter queue
would hold it: an SNS-triggered function's event with the error Lambda attaches, a queue-triggered function's
message as SQS moves it. That step fails the run (unless the function rejected the message as malformed:
``slsml.spec.errors.rejected``), as it does on AWS.

Faults (``slsml.local.faults``) can be injected: set ``FunctionHost.faults`` at any time (a read that faults set
before hold back is let go then), and read ``fault_report()`` for what was injected and what it caused.
"""

from __future__ import annotations

import contextlib
import importlib.machinery
import importlib.util
import io
import json
import math
import multiprocessing
import multiprocessing.forkserver
import os
import queue as queue_module
import shutil
import signal
import sys
import tempfile
import threading
import time
import traceback
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

from botocore.config import Config

from slsml.aws import clients as aws
from slsml.aws.cache import MEMORY_ENV
from slsml.local import accelerator, memory
from slsml.local import faults as fault_injection
from slsml.local.cloud import MAX_RECEIVES, REGION, LocalDeployment, environment_set, raw_delivery
from slsml.local.containers import Container, Containers
from slsml.local.faults import CRASH_KINDS, INJECTED_MARK, Faults, InvocationFaults, message_identity
from slsml.local.memory import Invocation, MemoryWatch
from slsml.local.private import private_folder
from slsml.pipeline.services import Services
from slsml.spec import wiring
from slsml.spec.deployment import DEFAULT_FUNCTIONS, checked_settings
from slsml.spec.errors import rejected
from slsml.spec.limits import RunLimits
from slsml.spec.messages import DEAD_LETTER_ERROR_CODE, DEAD_LETTER_ERROR_MESSAGE, DEAD_LETTER_REQUEST_ID, run_named
from slsml.training import quiet

FUNCTIONS_DIR = Path(__file__).resolve().parents[3] / "functions"
DUPLICATE_ATTRIBUTE = "slsml-duplicate"
DEAD_LETTER_WAIT_S = 5  # a dead-letter queue's long poll: a dead letter fails its run within this long
# a function queue's long poll: a message sent or come due wakes it at once (``moto_server``), so a longer one only
# spares the empty answers of idle queues (of the 1,465 requests a breast-cancer fit's host sent, 600 were 1 s polls
# answered empty); ``drain`` waits this long at most for the polls under way
QUEUE_WAIT_S = 5
ACKNOWLEDGE_WINDOW_S = 0.1  # handled messages are deleted together, a batch per queue, fewer requests
LAMBDA_ERROR_MESSAGE_BYTES = 1024  # Lambda truncates the error it attaches to a dead letter to 1 KB
_TRACEBACK = "\nTraceback (most recent call last):"
_LOG_BUFFER_BYTES = 1 << 20  # longer than any log line
PRELOAD = "slsml.local.preload"  # imported once by the process the function processes are forked from
INJECTED_KINDS = (
    "duplicate",
    "sns_delay",
    "worker_crash",
    "reducer_crash",
    "merger_crash",
    "worker_hang",
    "slow_worker",
    "late_worker",
    "s3_get_delay",
)

# ---- inside a function process ------------------------------------------------------------------

_handler: Any = None
_invocations: Any = None  # the host's end of a pipe: this process's invocations as they start and end
_offset_bytes = 0  # what a container of this function holds beyond this process's resident set (slsml.local.memory)


@dataclass
class LambdaContext:
    """The parts of Lambda's context object that handlers and Powertools read."""

    function_name: str
    aws_request_id: str
    deadline: float
    memory_limit_in_mb: int
    function_version: str = "$LATEST"

    @property
    def invoked_function_arn(self) -> str:
        return f"arn:aws:lambda:{REGION}:000000000000:function:{self.function_name}"

    def get_remaining_time_in_millis(self) -> int:
        return max(0, int((self.deadline - time.time()) * 1000))


def _start_process(function: str, environment: dict[str, str], log_path: str, invocations: Any) -> None:
    global _handler, _invocations, _offset_bytes
    preloaded = sys.modules.get(PRELOAD)  # imported by the fork server; not where each process starts anew (Windows)
    forked = memory.resident_bytes() or 0  # what this process holds as forked, before it imports its handler
    _end_with_host()
    os.environ.clear()  # forked from the preloaded server: the environment is the host's now, not the server's
    os.environ.update(environment)
    log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)  # its user's alone
    os.dup2(log, 1)
    os.dup2(log, 2)
    # the function's processes share its log: each line leaves in one append, whole, never split or interleaved
    sys.stdout = sys.stderr = io.TextIOWrapper(
        io.BufferedWriter(io.FileIO(log, "w", closefd=False), buffer_size=_LOG_BUFFER_BYTES), line_buffering=True
    )
    quiet.install()  # TensorFlow's start-up lines stay out of the JSON log
    if accelerator.ACCELERATOR_ENV in environment:  # before TensorFlow first runs: a logical GPU of its memory
        accelerator.hold_process(int(environment[accelerator.ACCELERATOR_ENV]))
    path = FUNCTIONS_DIR / function / "handler.py"
    spec = importlib.util.spec_from_file_location(f"slsml_function_{function}", path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    _handler = module.lambda_handler
    _invocations = invocations
    if preloaded is not None:
        tensorflow = wiring.function(function).needs_tensorflow
        _offset_bytes = (preloaded.TENSORFLOW_BYTES if tensorflow else preloaded.LIBRARIES_BYTES) - forked
    fault_injection.install(aws.client("s3"), aws.client("sns"))  # the clients the handler's services use
    started = {
        "level": "INFO",
        "message": "warm process started",
        "function_name": function,
        "pid": os.getpid(),
        "function_memory_size": int(os.environ[MEMORY_ENV]),
        "timestamp": time.time(),
    }
    print(json.dumps(started))


def _end_with_host() -> None:
    """End this process when the host process ends: one killed outright cannot shut its containers down."""
    host = multiprocessing.parent_process()  # whose sentinel is ready once it has exited
    assert host is not None, "a function process is started by its host"

    def watch() -> None:
        host.join()
        os._exit(0)

    threading.Thread(target=watch, name="host", daemon=True).start()


class TimedOut(BaseException):
    """The invocation ran past its function's timeout (a BaseException: handler code catches no such thing)."""


def _time_out(signum: int, frame: Any) -> None:
    raise TimedOut


def _invoke(
    event: dict[str, Any],
    function: str,
    request_id: str,
    plan: InvocationFaults | None = None,
    environment: dict[str, str] | None = None,
    timeout_s: float | None = None,
) -> dict[str, int]:
    """Run the handler once, for at most ``timeout_s`` (default: the function's timeout, as Lambda ends an
    invocation at its timeout); returns the counts of faults injected inside the process."""
    timeout_s = timeout_s or DEFAULT_FUNCTIONS[function].timeout_s
    started, memory_mb = time.time(), int(os.environ[MEMORY_ENV])
    context = LambdaContext(function, request_id, started + timeout_s, memory_mb)
    memory.reset_peak()
    _invocations.send((request_id, Invocation(function, os.getpid(), started, _offset_bytes, memory_mb)))
    timer = hasattr(signal, "setitimer")  # where the system has none (Windows), invocations are not timed
    if timer:
        signal.signal(signal.SIGALRM, _time_out)
        signal.setitimer(signal.ITIMER_REAL, timeout_s)
    try:
        with environment_set(environment or {}), fault_injection.invocation(plan) as injected:
            response = _handler(event, context)
        if isinstance(response, dict) and response.get("batchItemFailures"):  # a batch of one here: it failed
            raise RuntimeError(f"the function reported failed messages: {response['batchItemFailures']}")
        return dict(injected)
    except TimedOut:
        raise RuntimeError(f"Task timed out after {timeout_s:.2f} seconds") from None
    except Exception as error:  # re-raised as plain text: exceptions must cross the process boundary
        raise RuntimeError(f"{type(error).__name__}: {error}\n{traceback.format_exc()}") from None
    finally:
        if timer:
            signal.setitimer(signal.ITIMER_REAL, 0)
        _invocations.send((request_id, None))
        peak = memory.peak_bytes()
        used_mb = None if peak is None else memory.used_mb(peak + _offset_bytes)
        print(report_line(request_id, time.time() - started, memory_mb, used_mb))
        sys.stdout.flush()
        sys.stderr.flush()


def _ready() -> int:
    return os.getpid()


def report_line(request_id: str, duration_s: float, memory_mb: int, used_mb: int | None) -> str:
    """The REPORT line Lambda logs once an invocation ended (its peak memory where it was read)."""
    used = "" if used_mb is None else f"\tMax Memory Used: {used_mb} MB"
    return (
        f"REPORT RequestId: {request_id}\tDuration: {duration_s * 1000:.2f} ms"
        f"\tBilled Duration: {math.ceil(duration_s * 1000)} ms\tMemory Size: {memory_mb} MB{used}"
    )


# ---- in the host process ------------------------------------------------------------------------


def retry_after_s(receives: int) -> int:
    """How long a message whose invocation failed on its ``receives``-th try stays invisible: until its
    next try, or none after its last (its next receive moves it to the DLQ)."""
    return receives if receives < MAX_RECEIVES else 0


def sns_event(body: dict[str, Any], subscription_arn: str) -> dict[str, Any]:
    """The SNS envelope SQS received → the event Lambda would get from the same SNS delivery."""
    return {
        "Records": [
            {
                "EventSource": "aws:sns",
                "EventVersion": "1.0",
                "EventSubscriptionArn": subscription_arn,
                "Sns": {
                    "Type": body["Type"],
                    "MessageId": body["MessageId"],
                    "TopicArn": body["TopicArn"],
                    "Subject": body.get("Subject"),
                    "Message": body["Message"],
                    "Timestamp": body["Timestamp"],
                    "SignatureVersion": body.get("SignatureVersion", "1"),
                    "Signature": body.get("Signature", ""),
                    "SigningCertUrl": body.get("SigningCertURL", "https://sns.amazonaws.com/cert.pem"),
                    "UnsubscribeUrl": body.get("UnsubscribeURL", "https://sns.amazonaws.com/unsubscribe"),
                    "MessageAttributes": body.get("MessageAttributes", {}),
                },
            }
        ]
    }


def raw_body(message: dict[str, Any], topic_arn: str) -> dict[str, Any]:
    """A message SNS delivered raw (as it was published) to a queue that serves one topic, shaped like
    the envelope SNS would have wrapped it in."""
    sent = int(message.get("Attributes", {}).get("SentTimestamp", time.time() * 1000))
    stamp = datetime.fromtimestamp(sent / 1000, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    return {
        "Type": "Notification",
        "MessageId": message["MessageId"],
        "TopicArn": topic_arn,
        "Message": message["Body"],
        "Timestamp": stamp,
    }


def queued_body(message: dict[str, Any], queue_name: str) -> dict[str, Any]:
    """A message sent straight to a function's queue, shaped like a queued SNS message (the host
    reads its run and identity the same way)."""
    return {"TopicArn": queue_name, "MessageId": message["MessageId"], "Message": message["Body"]}


def sqs_event(message: dict[str, Any], queue_url: str) -> dict[str, Any]:
    """The event Lambda's SQS event source mapping would hand the function for ``message``."""
    now = str(int(time.time() * 1000))
    attributes = message.get("Attributes", {})
    return {
        "Records": [
            {
                "messageId": message["MessageId"],
                "receiptHandle": message["ReceiptHandle"],
                "body": message["Body"],
                "attributes": {
                    "ApproximateReceiveCount": attributes.get("ApproximateReceiveCount", "1"),
                    "SentTimestamp": attributes.get("SentTimestamp", now),
                    "SenderId": "slsml-local",
                    "ApproximateFirstReceiveTimestamp": now,
                },
                "messageAttributes": {},
                "md5OfBody": message["MD5OfBody"],
                "eventSource": "aws:sqs",
                "eventSourceARN": f"arn:aws:sqs:{REGION}:000000000000:{queue_url.rsplit('/', 1)[-1]}",
                "awsRegion": REGION,
            }
        ]
    }


def run_of(body: dict[str, Any]) -> str | None:
    """The run a queued SNS message is about, if any (None for a body of any other shape)."""
    message = body.get("Message") if isinstance(body, dict) else None
    return run_named(message) if isinstance(message, str) else None


def error_message(text: str) -> str:
    """A failed invocation's error (``Type: message`` and its traceback) as Lambda reports it on a dead
    letter: the exception's message alone, its first KB."""
    name, _, message = text.split(_TRACEBACK, 1)[0].partition(": ")
    return (message or name).encode()[:LAMBDA_ERROR_MESSAGE_BYTES].decode(errors="ignore")


def dead_letter_event(message_id: str, body: str, attributes: dict[str, str], queue_arn: str) -> dict[str, Any]:
    """The event Lambda's SQS event source mapping hands the dead-letter reader for one dead letter."""
    now = str(int(time.time() * 1000))
    return {
        "Records": [
            {
                "messageId": message_id,
                "receiptHandle": message_id,
                "body": body,
                "attributes": {
                    "ApproximateReceiveCount": "1",
                    "SentTimestamp": now,
                    "SenderId": "slsml-local",
                    "ApproximateFirstReceiveTimestamp": now,
                },
                "messageAttributes": {
                    name: {"stringValue": value, "dataType": "Number" if name == DEAD_LETTER_ERROR_CODE else "String"}
                    for name, value in attributes.items()
                },
                "md5OfBody": "",
                "eventSource": "aws:sqs",
                "eventSourceARN": queue_arn,
                "awsRegion": REGION,
            }
        ]
    }


def leave_out_main() -> Callable[[], None]:
    """Keep a script's top level out of the function processes until the returned function is called:
    multiprocessing runs the main module of the process that starts processes again in each of them (and in the
    fork server), so that a script calling slsml without an ``if __name__ == "__main__":`` guard would start again
    in each. They run slsml's handlers alone: the main module is announced as ``__main__`` by name, which
    multiprocessing leaves out. A main module without a file (a notebook, ``python -c``) is left as it is."""
    main = sys.modules.get("__main__")
    if main is None or getattr(main, "__spec__", None) is not None or not getattr(main, "__file__", None):
        return lambda: None
    main.__spec__ = importlib.machinery.ModuleSpec("__main__", None)

    def restore() -> None:
        main.__spec__ = None

    return restore


def start_preloading() -> multiprocessing.context.BaseContext:
    """The context warm processes start from: a fork server process (one per host process, kept for its
    lifetime) that imports ``PRELOAD`` from now on, while the caller goes on; where the system has no
    fork server (Windows), each process starts anew and imports everything itself."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    forkserver = multiprocessing.get_context("forkserver")
    forkserver.set_forkserver_preload([PRELOAD])
    with _output_elsewhere():
        multiprocessing.forkserver.ensure_running()  # and its resource tracker
    return forkserver


@contextlib.contextmanager
def _output_elsewhere() -> Iterator[None]:
    """While in it, this process's standard output and error are /dev/null, for the servers ``multiprocessing``
    starts to inherit: they outlive the command by as long as they take to end (the fork server with TensorFlow
    loaded), and a reader of the command's output (a pipe, ``| tee``, a test) would wait for them. The function
    processes write to their logs; neither server writes anything else."""
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    kept = [os.dup(fd) for fd in (1, 2)]
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        for fd in (1, 2):
            os.dup2(null, fd)
        yield
    finally:
        for fd, saved in zip((1, 2), kept, strict=True):
            os.dup2(saved, fd)
            os.close(saved)
        os.close(null)


class FunctionHost:
    """``faults``, ``function_environment`` (variables set in a function's process for each invocation, e.g. a
    ``ReadPolicy``'s) and the deployment's run limits (``set_limits``) may be changed while the host runs: each
    message received afterwards is handled under the new values."""

    def __init__(
        self,
        deployment: LocalDeployment,
        concurrency: dict[str, int],
        log_dir: Path,
        duplicate_deliveries: bool = False,
        tf_threads: int = 1,
        faults: Faults | None = None,
        function_environment: dict[str, str] | None = None,
        memory_mb: dict[str, int] | None = None,
        timeouts_s: dict[str, int] | None = None,
        accelerator_gib: dict[str, int] | None = None,
    ) -> None:
        self.deployment = deployment
        self.concurrency = concurrency
        self.log_dir = log_dir
        self.duplicate_deliveries = duplicate_deliveries
        self.tf_threads = tf_threads
        # a file per setting of the faults, created when they are lifted or replaced (``InvocationFaults.lifted``)
        self._lifts = Path(tempfile.mkdtemp(prefix="slsml-faults-"))
        self._faults: tuple[Faults | None, Path] = (faults, self._lifts / "0")
        self.function_environment = dict(function_environment or {})
        self.sqs = aws.new_client(
            "sqs", **deployment.client_arguments(), config=Config(max_pool_connections=64)
        )  # a long poll per queue at once
        self._done: queue_module.SimpleQueue[tuple[str, str]] = queue_module.SimpleQueue()  # (queue, receipt)
        self.services = Services.from_names(
            deployment.bucket, deployment.table, deployment.topic_arns, deployment.state_machine_arn
        )
        self._containers: dict[str, Containers] = {}  # each function's warm containers
        self._context: multiprocessing.context.BaseContext | None = None
        # each function's timeout (Lambda's: its deployment's, unless ``timeouts_s`` names another; the run limits'
        # for the functions a stage waits on); may be changed while the host runs
        self.timeouts: dict[str, float] = {name: DEFAULT_FUNCTIONS[name].timeout_s for name in concurrency}
        self.timeouts.update(checked_settings("timeout_s", timeouts_s or {}, concurrency))
        self.set_limits(RunLimits.model_validate_json(deployment.run_limits or "{}"))
        # each function's memory (Lambda's: its deployment's, unless ``memory_mb`` or ``resize`` names another): its
        # processes' AWS_LAMBDA_FUNCTION_MEMORY_SIZE, past which one running an invocation is killed
        self.memory_mb = {name: DEFAULT_FUNCTIONS[name].memory_mb for name in concurrency}
        self.memory_mb.update(checked_settings("memory_mb", memory_mb or {}, concurrency))
        self._watch = MemoryWatch(self._out_of_memory)
        # each function's GPU memory per warm process (``slsml.local.accelerator``); none named: no GPU
        self.accelerator_gib = dict(accelerator_gib or {})
        self._killed: dict[str, Invocation] = {}  # request id → its invocation, killed past its function's memory
        self._invocations: Any = None  # the two ends of the pipe the processes send their invocations on
        self._sender: Any = None
        self._stopping = threading.Event()
        self._draining = threading.Event()  # take no more messages; the functions' processes stay up
        self._pollers: list[threading.Thread] = []
        self._threads: list[threading.Thread] = []  # every thread of the host, the pollers among them
        self._held: dict[threading.Timer, str | None] = {}  # deliveries held back, not yet invoked → their run
        self._last_error: dict[str, tuple[str, str, str]] = {}  # message id → (first line, error text, request id)
        self._dead_seen: set[str] = set()  # dead letters recorded (one may be handed to the reader again)
        self._reader = wiring.dead_letter_reader().name
        self.invocations: dict[str, int] = dict.fromkeys(concurrency, 0)
        self.dead_letters: list[dict[str, Any]] = []
        # run by run (a message naming no run, a process replaced: under None): faults injected, invocations, failed
        # ones, retries; and the failures that were not injected, "function: first line"
        self._run_counts: defaultdict[str | None, Counter] = defaultdict(Counter)
        self._run_errors: defaultdict[str | None, Counter] = defaultdict(Counter)
        self._counts_lock = threading.Lock()
        self._merger_crashed: set[str] = set()  # runs whose Merger crashed on purpose already
        self._in_flight: Counter = Counter()  # run → messages received and not yet handled (held back or running)
        self._idle = threading.Condition()
        # functions triggered by a queue of their own (not through SNS): function → queue name
        self._queue_triggers = {fn.name: fn.queue.name for fn in wiring.FUNCTIONS if fn.queue is not None}
        # functions whose queue serves one topic get its messages raw: function → that topic's ARN
        self._raw_topics = {
            fn.name: deployment.topic_arns[fn.triggers[0].name] for fn in wiring.FUNCTIONS if raw_delivery(fn)
        }

    def set_limits(self, limits: RunLimits) -> None:
        """The deployment's run limits, from the next message on: the functions check runs against them, the
        functions a stage waits on are ended at the timeouts they name, as a deployment with them would, and a model
        dropped under ``incoming/`` trains with a deadline that fits them (``RunLimits.drop_in_defaults``)."""
        self.deployment.run_limits = limits.model_dump_json()
        self.deployment.run_defaults = limits.drop_in_defaults().model_dump_json()
        self.timeouts = {**self.timeouts, **limits.function_timeouts_s}

    def _count(self, counts: dict[str, int], run_id: str | None = None) -> None:
        with self._counts_lock:
            self._run_counts[run_id].update(counts)

    def _error(self, error: str, run_id: str | None) -> None:
        with self._counts_lock:
            self._run_errors[run_id][error] += 1

    def fault_report(self, run_id: str | None = None) -> dict[str, Any]:
        """Since the host started (of ``run_id``'s messages only, where it is given): the faults injected, per
        kind, and what happened — invocations that failed, how many of those SQS retried, messages that went to a
        dead-letter queue, and the errors of failures that were not injected; warm processes replaced after one
        died (whichever run's)."""
        with self._counts_lock:
            counts = sum((c for run, c in self._run_counts.items() if run_id in (None, run)), Counter())
            errors = dict(sum((e for run, e in self._run_errors.items() if run_id in (None, run)), Counter()))
            counts["replaced_processes"] = self._run_counts[None]["replaced_processes"]
        return {
            "faults": str(self.faults) if self.faults is not None else "",
            "injected": {kind: counts.get(kind, 0) for kind in INJECTED_KINDS},
            "invocations": sum(self.invocations.values()) if run_id is None else counts.get("invocations", 0),
            "failed_invocations": counts.get("failed_invocations", 0),
            "retries": counts.get("retries", 0),
            "dead_letters": sum(run_id in (None, letter["run_id"]) for letter in self.dead_letters),
            "replaced_processes": counts.get("replaced_processes", 0),
            "errors": errors,
        }

    def _handling(self, run_id: str | None, change: int) -> None:
        with self._idle:
            self._in_flight[run_id] += change
            self._idle.notify_all()

    def wait_idle(self, run_id: str, timeout_s: float) -> bool:
        """Wait until no message of ``run_id`` that the host received is still being handled (held
        back or in an invocation), so the run's function logs are complete; False after ``timeout_s``."""
        with self._idle:
            return self._idle.wait_for(lambda: self._in_flight[run_id] <= 0, timeout=timeout_s)

    def drain(self, timeout_s: float) -> bool:
        """Take no more messages and wait until every message taken is handled, so that every function log is
        complete and no request is still to come; False after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        self._draining.set()
        for poller in self._pollers:  # each ends when its long poll returns, after handing on what it received
            poller.join(timeout=max(0.0, deadline - time.monotonic()))
        with self._idle:
            return self._idle.wait_for(
                lambda: all(n <= 0 for n in self._in_flight.values()), timeout=max(0.0, deadline - time.monotonic())
            )

    def _environment(self, function: str) -> dict[str, str]:
        threads = str(self.tf_threads)
        return {
            **self.deployment.environment(),
            **self.deployment.signing_as(function),  # as its role
            "AWS_LAMBDA_FUNCTION_NAME": function,
            # app/slsml-<function> in the User-Agent: the embedded cloud's request log names whose request it was
            "AWS_SDK_UA_APP_ID": f"slsml-{function}",
            MEMORY_ENV: str(self.memory_mb[function]),
            **accelerator.process_environment(self.accelerator_gib.get(function)),
            wiring.STORAGE_ENV: str(DEFAULT_FUNCTIONS[function].ephemeral_storage_mb),
            "POWERTOOLS_SERVICE_NAME": "slsml",
            "POWERTOOLS_METRICS_NAMESPACE": "slsml",
            "POWERTOOLS_TRACE_DISABLED": "true",
            "TF_NUM_INTRAOP_THREADS": threads,
            "TF_NUM_INTEROP_THREADS": threads,
            "OMP_NUM_THREADS": threads,
            "TF_CPP_MIN_LOG_LEVEL": "2",
        }

    def start(self) -> None:
        """Start every function's warm processes (waiting for their imports) and queue pollers."""
        private_folder(self.log_dir)
        self._context = start_preloading()
        self._invocations, self._sender = self._context.Pipe(duplex=False)
        replaced = partial(self._count, {"replaced_processes": 1})
        warmups: list[Future] = []
        for function, size in self.concurrency.items():
            containers = self._containers[function] = Containers(size, partial(self._new_container, function), replaced)
            warmups += containers.start(_ready)
        for warmup in warmups:
            warmup.result()
        for function in (f for f in self.concurrency if f in self.deployment.queues):  # the reader has none
            self._pollers.append(self._thread(self._poll, f"poll-{function}", function))
        self._thread(self._delete_handled, "acknowledge")
        self._thread(self._follow_invocations, "invocations")
        self._thread(self._watch.run, "memory", self._stopping)
        for function, queue in self.deployment.dead_letter_queues.items():
            self._thread(self._watch_dead_letters, f"dead-letters-{function}", function, queue)

    def _thread(self, target: Callable[..., None], name: str, *args: Any) -> threading.Thread:
        thread = threading.Thread(target=target, args=args, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)
        return thread

    def _new_container(self, function: str) -> Container:
        """A warm container of ``function``, with its memory setting now (its process started when first called)."""
        return ProcessPoolExecutor(
            max_workers=1,
            mp_context=self._context,
            initializer=_start_process,
            initargs=(
                function,
                {**os.environ, **self._environment(function)},
                str(self.log_dir / f"{function}.log"),
                self._sender,
            ),
        )

    def resize(self, memory_mb: dict[str, int]) -> None:
        """Give functions another memory size (function → MB), as a deployment's update does: fresh processes with
        it take their next invocations, and those running end in theirs."""
        for function, size in checked_settings("memory_mb", memory_mb, self.concurrency).items():
            self.memory_mb[function] = size
            if function in self._containers:
                self._containers[function].renew()

    def _follow_invocations(self) -> None:
        """Hand the memory watch the invocations the function processes start and end."""
        while not self._stopping.is_set():
            try:
                request_id, invocation = self._invocations.recv()
            except (EOFError, OSError):
                return
            if request_id is None:  # the host's own: it is stopping (``join``)
                return
            if invocation is None:
                self._watch.ended(request_id)
            else:
                self._watch.started(request_id, invocation)

    def _out_of_memory(self, request_id: str, invocation: Invocation) -> None:
        """Record an invocation whose process is killed past its function's memory, and log its end as Lambda's
        runtime logs it."""
        with self._counts_lock:
            self._killed[request_id] = invocation
        duration_s = time.time() - invocation.started
        lines = (
            f"RequestId: {request_id} Error: Runtime exited with error: signal: killed",
            "Runtime.ExitError",
            report_line(request_id, duration_s, invocation.memory_mb, invocation.memory_mb),
        )
        with open(self.log_dir / f"{invocation.function}.log", "a") as log:
            log.write("\n".join(lines) + "\n")

    def _exit_error(self, function: str, request_id: str, error: BaseException) -> str:
        """Why an invocation ended with its process: killed past its function's memory, or its process died."""
        with self._counts_lock:
            killed = self._killed.pop(request_id, None)
        if killed is not None:
            return (
                "Runtime.ExitError: Runtime exited with error: signal: killed"
                f" (out of memory: past the {function} function's {killed.memory_mb} MB)"
            )
        return f"Runtime exited: a warm process of {function} died ({error})"

    @property
    def faults(self) -> Faults | None:
        """The faults injected into each message received from now on (None: none)."""
        return self._faults[0]

    @faults.setter
    def faults(self, faults: Faults | None) -> None:
        """Set at any time: the S3 reads that the faults before still hold back go on at once."""
        _, lifted = self._faults
        self._faults = faults, self._lifts / str(int(lifted.name) + 1)
        lifted.touch()

    def stop(self) -> None:
        """Take no more messages, start no more invocations (those held back are dropped) and shut the function
        processes down. The threads are not waited for here (``join``): each ends when its long poll returns (at
        once if the cloud is stopped) and hands nothing on."""
        self._stopping.set()
        with self._counts_lock:
            held, self._held = self._held, {}
        for timer, run_id in held.items():
            timer.cancel()
            self._handling(run_id, -1)
        for containers in self._containers.values():
            containers.close()
        shutil.rmtree(self._lifts, ignore_errors=True)

    def join(self, timeout_s: float) -> None:
        """After ``stop``, wait up to ``timeout_s`` for every thread of the host to end: a caller that goes on after
        the runtime (seeding Python's generator, which a retrying AWS client draws its jitter from) shares its process
        with none of them."""
        deadline = time.monotonic() + timeout_s
        if self._sender is not None:
            self._sender.send((None, None))  # wakes the thread following the invocations
        for thread in self._threads:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))

    def _poll(self, function: str) -> None:
        queue = self.deployment.queues[function]
        free = threading.Semaphore(self.concurrency[function])
        while not (self._stopping.is_set() or self._draining.is_set()):
            if not free.acquire(timeout=0.5):
                continue
            capacity = 1
            while capacity < 10 and free.acquire(blocking=False):
                capacity += 1
            try:
                received = self.sqs.receive_message(
                    QueueUrl=queue,
                    MaxNumberOfMessages=capacity,
                    WaitTimeSeconds=QUEUE_WAIT_S,
                    MessageAttributeNames=["All"],
                    AttributeNames=["ApproximateReceiveCount", "SentTimestamp"],
                ).get("Messages", [])
            except Exception:  # the cloud is shutting down
                received = []
            for _ in range(capacity - len(received)):
                free.release()
            for message in received:
                self._dispatch(function, queue, message, free)

    def _queued(self, function: str, message: dict[str, Any]) -> dict[str, Any]:
        """The SNS message a queued message carries (or stands for, on a function's own queue)."""
        if function in self._queue_triggers:
            return queued_body(message, self._queue_triggers[function])
        if function in self._raw_topics:
            return raw_body(message, self._raw_topics[function])
        return json.loads(message["Body"])

    def _dispatch(self, function: str, queue: str, message: dict[str, Any], free: threading.Semaphore) -> None:
        queue_name = self._queue_triggers.get(function)
        body = self._queued(function, message)
        faults, lifted = self._faults
        fault_spec = faults if faults is not None and faults.active else None
        identity = message_identity(body)
        receives = int(message.get("Attributes", {}).get("ApproximateReceiveCount", "1"))
        copy = DUPLICATE_ATTRIBUTE in message.get("MessageAttributes", {})
        if (
            not copy
            and receives == 1
            and (self.duplicate_deliveries or (fault_spec is not None and fault_spec.duplicates(identity)))
        ):
            self.sqs.send_message(
                QueueUrl=queue,
                MessageBody=message["Body"],
                MessageAttributes={DUPLICATE_ATTRIBUTE: {"DataType": "String", "StringValue": "1"}},
            )
            self._count({"duplicate": 1}, run_of(body))
        run_id = run_of(body)
        plan, delayed_s, late_s = None, 0.0, 0.0
        if fault_spec is not None:
            plan = fault_spec.for_invocation(function, identity, receives, run_id not in self._merger_crashed)
            plan = plan.model_copy(update={"lifted": str(lifted)})
            delayed_s, late_s = fault_spec.held_back(identity, receives), fault_spec.late(function, identity)
        hold_s = delayed_s + late_s
        event = sns_event(body, f"{body['TopicArn']}:{function}") if queue_name is None else sqs_event(message, queue)
        environment = {
            wiring.RUN_LIMITS_ENV: self.deployment.run_limits,
            wiring.RUN_DEFAULTS_ENV: self.deployment.run_defaults,
            **self.function_environment,
        }
        request_id = str(uuid.uuid4())
        slot_taken = True  # the poller took one of the function's slots for this message

        def release_slot() -> None:
            nonlocal slot_taken
            if slot_taken:
                slot_taken = False
                free.release()

        def finished(done: Future) -> None:
            release_slot()
            self._handling(run_id, -1)
            if self._stopping.is_set():
                return  # the cloud is going away: nothing to acknowledge
            error = done.exception()
            if error is None:
                self._count(done.result() or {}, run_id)
                self._done.put((queue, message["ReceiptHandle"]))
                return
            if isinstance(error, BrokenProcessPool):  # its process died: retried in a fresh one, as on Lambda
                error = RuntimeError(self._exit_error(function, request_id, error))
            text = str(error)
            self._last_error[body["MessageId"]] = (text.splitlines()[0][:500], text, request_id)
            counts = {"failed_invocations": 1, "retries": int(receives < MAX_RECEIVES)}
            if text.startswith(INJECTED_MARK):
                hung = plan is not None and plan.crash == "hang"
                counts["worker_hang" if hung else CRASH_KINDS.get(function, f"{function}_crash")] = 1
                if function == "merger" and run_id:
                    self._merger_crashed.add(run_id)
            else:
                self._error(f"{function}: {text.splitlines()[0][:200]}", run_id)
            self._count(counts, run_id)
            self.sqs.change_message_visibility(
                QueueUrl=queue, ReceiptHandle=message["ReceiptHandle"], VisibilityTimeout=retry_after_s(receives)
            )

        def invoke() -> None:
            if self._stopping.is_set():
                release_slot()
                self._handling(run_id, -1)
                return
            with self._counts_lock:
                self.invocations[function] += 1
                self._run_counts[run_id]["invocations"] += 1
            try:
                future = self._containers[function].submit(
                    _invoke, event, function, request_id, plan, environment, self.timeouts.get(function)
                )
            except RuntimeError:  # the host is stopping
                release_slot()
                self._handling(run_id, -1)
                return
            if plan is not None and plan.slow_s:
                self._count({"slow_worker": 1}, run_id)
            future.add_done_callback(finished)

        self._handling(run_id, +1)
        if hold_s > 0:
            # a delivery still in flight: the poller may take other messages meanwhile, and a container
            # runs this one when one is free (its slot is not taken again, so not given back)
            self._count({"sns_delay": int(delayed_s > 0), "late_worker": int(late_s > 0)}, run_id)
            release_slot()
            timer = threading.Timer(hold_s, lambda: self._held_back(timer, invoke))
            timer.daemon = True
            with self._counts_lock:
                if not self._stopping.is_set():
                    self._held[timer] = run_id
                    timer.start()
                    return
            self._handling(run_id, -1)
        else:
            invoke()

    def _held_back(self, timer: threading.Timer, invoke: Callable[[], None]) -> None:
        """Invoke a delivery held back, unless the host stopped meanwhile (``stop`` dropped it)."""
        with self._counts_lock:
            if self._held.pop(timer, False) is False:
                return
        invoke()

    def _delete_handled(self) -> None:
        """Acknowledge handled messages in batches (one request for up to ten of a queue), gathered over
        ``ACKNOWLEDGE_WINDOW_S``: a handled message stays invisible for the queue's visibility timeout."""
        while not self._stopping.is_set():
            try:
                handled = [self._done.get(timeout=0.5)]
            except queue_module.Empty:
                continue
            self._stopping.wait(ACKNOWLEDGE_WINDOW_S)
            while len(handled) < 100:
                try:
                    handled.append(self._done.get_nowait())
                except queue_module.Empty:
                    break
            by_queue: dict[str, list[str]] = {}
            for queue, receipt in handled:
                by_queue.setdefault(queue, []).append(receipt)
            for queue, receipts in by_queue.items():
                for start in range(0, len(receipts), 10):
                    entries = [{"Id": str(i), "ReceiptHandle": r} for i, r in enumerate(receipts[start : start + 10])]
                    try:
                        self.sqs.delete_message_batch(QueueUrl=queue, Entries=entries)
                    except Exception:  # the cloud is shutting down
                        return

    def _watch_dead_letters(self, function: str, queue: str) -> None:
        while not self._stopping.is_set():
            try:
                received = self.sqs.receive_message(
                    QueueUrl=queue, MaxNumberOfMessages=10, WaitTimeSeconds=DEAD_LETTER_WAIT_S
                ).get("Messages", [])
            except Exception:  # the cloud is shutting down
                return
            for message in received:
                self._on_dead_letter(function, queue, message)

    def _on_dead_letter(self, function: str, queue: str, message: dict[str, Any]) -> None:
        """Record a dead letter (once) and hand it to the dead-letter reader as its AWS dead-letter queue
        would: deleted once handled, received again if the reader fails."""
        body = self._queued(function, message)
        first_line, text, request_id = self._last_error.get(body.get("MessageId", ""), ("unknown error", "", ""))
        run_id = run_of(body)
        if message["MessageId"] not in self._dead_seen:
            self._dead_seen.add(message["MessageId"])
            letter = {
                "function": function,
                "run_id": run_id,
                "error": first_line,
                "rejected": rejected(first_line),
                "message_id": body.get("MessageId"),
                "message": body.get("Message"),
            }
            self.dead_letters.append(letter)
            with open(self.log_dir / "dead-letters.jsonl", "a") as log:
                log.write(json.dumps(letter) + "\n")
        if function in self._queue_triggers:  # SQS moved it: the message as sent, no error
            dead, attributes = message["Body"], {}
        else:  # Lambda's asynchronous-invocation DLQ: the function's event, with the error
            dead = json.dumps(sns_event(body, f"{body['TopicArn']}:{function}"))
            attributes = (
                {
                    DEAD_LETTER_ERROR_CODE: "200",
                    DEAD_LETTER_ERROR_MESSAGE: error_message(text),
                    DEAD_LETTER_REQUEST_ID: request_id,
                }
                if text
                else {}
            )
        event = dead_letter_event(message["MessageId"], dead, attributes, self.deployment.dead_letter_arns[function])

        def handled(done: Future) -> None:
            self._handling(run_id, -1)
            if done.exception() is not None:
                self._error(f"{self._reader}: {str(done.exception()).splitlines()[0][:200]}", run_id)
            elif not self._stopping.is_set():
                self.sqs.delete_message(QueueUrl=queue, ReceiptHandle=message["ReceiptHandle"])

        self._handling(run_id, +1)
        with self._counts_lock:
            self.invocations[self._reader] = self.invocations.get(self._reader, 0) + 1
        try:
            future = self._containers[self._reader].submit(_invoke, event, self._reader, str(uuid.uuid4()))
        except RuntimeError:  # the host is stopping
            self._handling(run_id, -1)
            return
        future.add_done_callback(handled)
