"""The function host: long-polls each function's queue and runs the real handler in a pool of warm
processes (one import of the handler, TensorFlow included, per process, like a warm Lambda
container), with an SNS-shaped event and a Lambda-like context. A failed invocation is retried
by SQS; after three receives the message goes to the function's DLQ and its run is failed.
"""

from __future__ import annotations

import importlib.util
import json
import multiprocessing
import os
import sys
import threading
import time
import traceback
import uuid
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3

from slsml import keys
from slsml.local.cloud import REGION, LocalDeployment
from slsml.runstate import RunTable

FUNCTIONS_DIR = Path(__file__).resolve().parents[3] / "functions"
DUPLICATE_ATTRIBUTE = "slsml-duplicate"
FUNCTION_TIMEOUT_S = 900

# ---- inside a function process ------------------------------------------------------------------

_handler: Any = None


@dataclass
class LambdaContext:
    """The parts of Lambda's context object that handlers and Powertools read."""

    function_name: str
    aws_request_id: str
    deadline: float
    memory_limit_in_mb: int = 3008
    function_version: str = "$LATEST"

    @property
    def invoked_function_arn(self) -> str:
        return f"arn:aws:lambda:{REGION}:000000000000:function:{self.function_name}"

    def get_remaining_time_in_millis(self) -> int:
        return max(0, int((self.deadline - time.time()) * 1000))


def _start_process(function: str, environment: dict[str, str], log_path: str) -> None:
    global _handler
    os.environ.update(environment)
    log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    path = FUNCTIONS_DIR / function / "handler.py"
    spec = importlib.util.spec_from_file_location(f"slsml_function_{function}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    _handler = module.lambda_handler


def _invoke(event: dict[str, Any], function: str, request_id: str) -> None:
    context = LambdaContext(function, request_id, time.time() + FUNCTION_TIMEOUT_S)
    try:
        _handler(event, context)
    except Exception as error:  # re-raised as plain text: exceptions must cross the process boundary
        raise RuntimeError(f"{type(error).__name__}: {error}\n{traceback.format_exc()}") from None
    finally:
        sys.stdout.flush()
        sys.stderr.flush()


def _ready() -> int:
    return os.getpid()


# ---- in the host process ------------------------------------------------------------------------


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


def run_of(body: dict[str, Any]) -> str | None:
    """The run a queued SNS message is about, if any."""
    try:
        message = json.loads(body["Message"])
    except (KeyError, ValueError):
        return None
    if "run_id" in message:
        return message["run_id"]
    for record in message.get("Records", []):
        parsed = keys.parse_model_key(record.get("s3", {}).get("object", {}).get("key", ""))
        if parsed:
            return parsed[0]
    return None


class FunctionHost:
    def __init__(
        self,
        deployment: LocalDeployment,
        concurrency: dict[str, int],
        log_dir: Path,
        duplicate_deliveries: bool = False,
        tf_threads: int = 1,
    ) -> None:
        self.deployment = deployment
        self.concurrency = concurrency
        self.log_dir = log_dir
        self.duplicate_deliveries = duplicate_deliveries
        self.tf_threads = tf_threads
        self.sqs = boto3.client("sqs", endpoint_url=deployment.endpoint, region_name=REGION)
        self.table = RunTable(
            boto3.resource("dynamodb", endpoint_url=deployment.endpoint, region_name=REGION).Table(deployment.table)
        )
        self._pools: dict[str, ProcessPoolExecutor] = {}
        self._threads: list[threading.Thread] = []
        self._stopping = threading.Event()
        self._last_error: dict[str, str] = {}
        self.invocations: dict[str, int] = dict.fromkeys(concurrency, 0)
        self.dead_letters: list[dict[str, Any]] = []

    def _environment(self, function: str) -> dict[str, str]:
        threads = str(self.tf_threads)
        return {
            **self.deployment.environment(),
            "AWS_LAMBDA_FUNCTION_NAME": function,
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
        self.log_dir.mkdir(parents=True, exist_ok=True)
        spawn = multiprocessing.get_context("spawn")
        warmups: list[Future] = []
        for function, size in self.concurrency.items():
            pool = ProcessPoolExecutor(
                max_workers=size,
                mp_context=spawn,
                initializer=_start_process,
                initargs=(function, self._environment(function), str(self.log_dir / f"{function}.log")),
            )
            self._pools[function] = pool
            warmups += [pool.submit(_ready) for _ in range(size)]
        for warmup in warmups:
            warmup.result()
        for function in self.concurrency:
            thread = threading.Thread(target=self._poll, args=(function,), name=f"poll-{function}", daemon=True)
            thread.start()
            self._threads.append(thread)
        watcher = threading.Thread(target=self._watch_dead_letters, name="dead-letters", daemon=True)
        watcher.start()
        self._threads.append(watcher)

    def stop(self) -> None:
        self._stopping.set()
        for thread in self._threads:
            thread.join(timeout=5)
        for pool in self._pools.values():
            pool.shutdown(wait=False, cancel_futures=True)

    def _poll(self, function: str) -> None:
        queue = self.deployment.queues[function]
        pool = self._pools[function]
        free = threading.Semaphore(self.concurrency[function])
        while not self._stopping.is_set():
            if not free.acquire(timeout=0.5):
                continue
            capacity = 1
            while capacity < 10 and free.acquire(blocking=False):
                capacity += 1
            try:
                received = self.sqs.receive_message(
                    QueueUrl=queue,
                    MaxNumberOfMessages=capacity,
                    WaitTimeSeconds=1,
                    MessageAttributeNames=["All"],
                    AttributeNames=["ApproximateReceiveCount"],
                ).get("Messages", [])
            except Exception:  # the cloud is shutting down
                received = []
            for _ in range(capacity - len(received)):
                free.release()
            for message in received:
                self._dispatch(function, queue, pool, message, free)

    def _dispatch(
        self, function: str, queue: str, pool: ProcessPoolExecutor, message: dict[str, Any], free: threading.Semaphore
    ) -> None:
        body = json.loads(message["Body"])
        if self.duplicate_deliveries and DUPLICATE_ATTRIBUTE not in message.get("MessageAttributes", {}):
            self.sqs.send_message(
                QueueUrl=queue,
                MessageBody=message["Body"],
                MessageAttributes={DUPLICATE_ATTRIBUTE: {"DataType": "String", "StringValue": "1"}},
            )
        self.invocations[function] += 1
        future = pool.submit(_invoke, sns_event(body, f"{body['TopicArn']}:{function}"), function, str(uuid.uuid4()))

        def finished(done: Future) -> None:
            free.release()
            error = done.exception()
            if error is None:
                self.sqs.delete_message(QueueUrl=queue, ReceiptHandle=message["ReceiptHandle"])
                return
            self._last_error[body["MessageId"]] = str(error).splitlines()[0][:500]
            receives = int(message.get("Attributes", {}).get("ApproximateReceiveCount", "1"))
            self.sqs.change_message_visibility(
                QueueUrl=queue, ReceiptHandle=message["ReceiptHandle"], VisibilityTimeout=min(receives, 5)
            )

        future.add_done_callback(finished)

    def _watch_dead_letters(self) -> None:
        while not self._stopping.is_set():
            for function, queue in self.deployment.dead_letter_queues.items():
                try:
                    received = self.sqs.receive_message(QueueUrl=queue, MaxNumberOfMessages=10).get("Messages", [])
                except Exception:  # the cloud is shutting down
                    return
                for message in received:
                    self._on_dead_letter(function, json.loads(message["Body"]))
                    self.sqs.delete_message(QueueUrl=queue, ReceiptHandle=message["ReceiptHandle"])
            self._stopping.wait(0.5)

    def _on_dead_letter(self, function: str, body: dict[str, Any]) -> None:
        error = self._last_error.get(body.get("MessageId", ""), "unknown error")
        run_id = run_of(body)
        self.dead_letters.append({"function": function, "run_id": run_id, "error": error})
        with open(self.log_dir / "dead-letters.jsonl", "a") as log:
            log.write(json.dumps({"function": function, "error": error, "message": body.get("Message")}) + "\n")
        if run_id:
            self.table.fail(run_id, f"{function} failed three times on one message: {error}")
