"""moto in server mode (a child process) and the resources of the wiring spec in it. Every request to it is signed
with credentials generated for it as it starts (``moto_server``'s checks): its clients here sign with its owner's,
and a deployment hands them on to whatever reaches it; each function signs with its own, as the principal of its
role (``role_arn``), and the bucket lifecycle's expirations with theirs: the bucket's policy, the deployed stack's,
tells them apart."""

from __future__ import annotations

import json
import os
import secrets
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from slsml.aws import clients as aws
from slsml.local.moto_server import LOOPBACK, OWNER_PATH
from slsml.spec import deployment as deployment_spec
from slsml.spec import wiring
from slsml.state import orchestration, records

REGION = "us-east-1"
ACCOUNT = "123456789012"  # moto's
OWNER_ARN = f"arn:aws:iam::{ACCOUNT}:user/slsml-local"  # the principal of the owner's credentials
LIFECYCLE = "lifecycle"  # the identity of the bucket's lifecycle expirations (``slsml.local.lifecycle``)
MAX_RECEIVES = 3  # Lambda's first try + its two async retries, then the DLQ
VISIBILITY_TIMEOUT_S = 900


@dataclass
class LocalDeployment:
    endpoint: str
    bucket: str
    table: str
    topic_arns: dict[str, str]
    state_machine_arn: str = ""
    run_defaults: str = ""  # JSON of a DropInRequest, for models dropped under incoming/
    run_limits: str = ""  # JSON of the RunLimits every run must keep within (slsml.spec.deployment)
    queues: dict[str, str] = field(default_factory=dict)  # function → queue URL
    dead_letter_queues: dict[str, str] = field(default_factory=dict)  # function → its DLQ's URL
    dead_letter_arns: dict[str, str] = field(default_factory=dict)  # function → its DLQ's ARN
    queue_urls: dict[str, str] = field(default_factory=dict)  # wiring queue name → URL
    signing_key: str = ""  # the ARN of the KMS key that seals runs' signing keys (slsml.pipeline.proof)
    access_key_id: str = ""  # the credentials its requests are signed with (``EmbeddedCloud.credentials``)
    secret_access_key: str = ""
    # function (and LIFECYCLE) → its access key id and secret access key (``EmbeddedCloud.identities``)
    identities: dict[str, list[str]] = field(default_factory=dict)

    @property
    def deadline_queue_url(self) -> str:
        return self.queue_urls[wiring.DEADLINES.name]

    @property
    def credentials(self) -> Credentials:
        return Credentials(self.access_key_id, self.secret_access_key)

    def signing_as(self, identity: str) -> dict[str, str]:
        """The variables with which a client signs as ``identity`` (a function, or LIFECYCLE)."""
        key, secret = self.identities[identity]
        return {"AWS_ACCESS_KEY_ID": key, "AWS_SECRET_ACCESS_KEY": secret}

    def client_arguments(self) -> dict[str, str]:
        """boto3's ``client`` arguments that reach the embedded cloud."""
        return {
            "endpoint_url": self.endpoint,
            "region_name": REGION,
            "aws_access_key_id": self.access_key_id,
            "aws_secret_access_key": self.secret_access_key,
        }

    def environment(self) -> dict[str, str]:
        """What a function (or this process) needs to reach the embedded cloud."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": self.access_key_id,
            "AWS_SECRET_ACCESS_KEY": self.secret_access_key,
            "AWS_DEFAULT_REGION": REGION,
            "AWS_REGION": REGION,
            wiring.BUCKET_ENV: self.bucket,
            wiring.TABLE_ENV: self.table,
            wiring.STATE_MACHINE_ENV: self.state_machine_arn,
            wiring.SIGNING_KEY_ENV: self.signing_key,
            wiring.RUN_DEFAULTS_ENV: self.run_defaults,
            wiring.RUN_LIMITS_ENV: self.run_limits,
            wiring.DEAD_LETTER_SOURCES_ENV: json.dumps(
                wiring.dead_letter_sources(
                    [(arn, function) for function, arn in self.dead_letter_arns.items()], self.topic_arns
                )
            ),
            **{t.env_var: self.topic_arns[t.name] for t in wiring.TOPICS},
            **{q.env_var: self.queue_urls[q.name] for q in wiring.QUEUES},
        }


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind((LOOPBACK, 0))
        return probe.getsockname()[1]


_SERVER = Path(__file__).with_name("moto_server.py")  # moto's server, tuned; run with -P (its folder off sys.path)
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # to loopback: never through a proxy


def generated_credentials() -> Credentials:
    """An access key id and secret access key, new and unguessable, for one embedded cloud."""
    return Credentials(f"SLSML{secrets.token_hex(8).upper()}", secrets.token_urlsafe(30))


def role_arn(identity: str) -> str:
    """The principal a function's requests (or LIFECYCLE's) come from."""
    return f"arn:aws:iam::{ACCOUNT}:role/slsml-local-{identity}"


def bucket_policy(bucket: str) -> dict[str, Any]:
    """The bucket's policy as the deployed stack's (infra/storage.py): create-only, and deletes under runs/ refused to
    all but the functions that delete each kind, and the lifecycle (CDK's handler that empties a destroyed bucket,
    on AWS)."""
    arn = f"arn:aws:s3:::{bucket}"
    roles = {fn.name: role_arn(fn.name) for fn in wiring.FUNCTIONS}
    deleters = deployment_spec.run_deleters(roles, [role_arn(LIFECYCLE)])
    statements = deployment_spec.bucket_policy_statements(arn) + deployment_spec.deletion_statements(arn, deleters)
    return {"Version": "2012-10-17", "Statement": statements}


def key_policy() -> dict[str, Any]:
    """The signing key's policy as the deployed stack's (infra/signing.py): the account's, and each function's use of
    it denied beyond its own kind's keys."""
    roles = {fn.name: role_arn(fn.name) for fn in wiring.FUNCTIONS}
    account = {
        "Sid": "Account",
        "Effect": "Allow",
        "Principal": {"AWS": f"arn:aws:iam::{ACCOUNT}:root"},
        "Action": "kms:*",
        "Resource": "*",
    }
    return {"Version": "2012-10-17", "Statement": [account, *deployment_spec.key_policy_statements(roles)]}


def signed(
    method: str, url: str, credentials: Credentials, body: bytes = b"", headers: dict[str, str] | None = None
) -> urllib.request.Request:
    """An HTTP request to the embedded cloud, signed with ``credentials`` as an AWS client signs (SigV4, by
    botocore's signer): moto's management endpoints and ``OWNER_PATH`` take no AWS client."""
    request = AWSRequest(method=method, url=url, data=body, headers=dict(headers or {}))
    SigV4Auth(credentials, "moto", REGION).add_auth(request)
    return urllib.request.Request(url, data=body or None, headers=dict(request.headers.items()), method=method)


def _identity(credentials: Credentials, arn: str) -> dict[str, str]:
    return {"access_key_id": credentials.access_key, "secret_access_key": credentials.secret_key, "arn": arn}


class EmbeddedCloud:
    """S3, SNS, SQS, DynamoDB, Step Functions and KMS on 127.0.0.1 for as long as this object is started.

    moto serves from a child process: moto keeps its state per process, so two clouds in one
    process would share (and reset) each other's resources. Measured side by side, a thread of
    this process was no faster (30-iteration demo runs: 854/708 ms vs 770/727 ms per iteration).
    """

    def __init__(self, port: int | None = None) -> None:
        self.port = port or _free_port()
        self.endpoint = f"http://{LOOPBACK}:{self.port}"
        self.credentials = generated_credentials()  # its owner's: what the management endpoints answer
        # each function's (and LIFECYCLE's), signing as its role: what else it answers
        self.identities = {name: generated_credentials() for name in (*(fn.name for fn in wiring.FUNCTIONS), LIFECYCLE)}
        self._server: subprocess.Popen | None = None

    def launch(self) -> None:
        """Start the server's process, without waiting for it to serve (``start`` waits), handing it its
        credentials on its standard input (an argument would show them to every user). It ends with this
        process, if not stopped before: it watches its standard input, this end of a pipe."""
        if self._server is None:
            self._server = subprocess.Popen(
                [sys.executable, "-P", str(_SERVER), "-p", str(self.port)],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            assert self._server.stdin is not None
            given = {
                **_identity(self.credentials, OWNER_ARN),
                "others": [_identity(made, role_arn(name)) for name, made in self.identities.items()],
            }
            self._server.stdin.write(json.dumps(given).encode() + b"\n")
            self._server.stdin.flush()

    def call(self, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None) -> bytes:
        """The body of the answer to a signed request for ``path`` (moto's management endpoints: ``/moto-api/…``);
        urllib's HTTPError where it is not a success."""
        request = signed(method, f"{self.endpoint}{path}", self.credentials, body, headers)
        with _DIRECT.open(request, timeout=30) as answer:
            return answer.read()

    def start(self) -> None:
        """Launch the server (if not launched yet) and wait until it serves."""
        self.launch()
        deadline = time.monotonic() + 60
        while True:
            try:
                with _DIRECT.open(signed("GET", f"{self.endpoint}{OWNER_PATH}", self.credentials), timeout=1):
                    return
            except OSError:
                if self._server is None or self._server.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError("the embedded cloud (moto server) did not start") from None
                time.sleep(0.1)

    def stop(self) -> None:
        if self._server is not None:
            if self._server.stdin is not None:
                self._server.stdin.close()
            self._server.terminate()
            try:
                self._server.wait(timeout=1)
            except subprocess.TimeoutExpired:  # waits on a state machine execution: its state goes anyway
                self._server.kill()
                self._server.wait()
            self._server = None

    def client(self, service: str, identity: str | None = None) -> Any:
        """A new client of ``service`` in this cloud, signing as its owner (or as ``identity``: a function, or
        LIFECYCLE)."""
        credentials = self.credentials if identity is None else self.identities[identity]
        return aws.new_client(
            service,
            config=aws.SIGNING.get(service),
            endpoint_url=self.endpoint,
            region_name=REGION,
            aws_access_key_id=credentials.access_key,
            aws_secret_access_key=credentials.secret_key,
        )

    def provision(self, name: str = "slsml") -> LocalDeployment:
        """Create bucket, table, topics, one queue (+ DLQ) per function (subscribed to its topics, or the
        queue that triggers it; none for the dead-letter reader, which the host hands the DLQs' messages)
        the bucket notifications, and the signing key with its policy (enforced by ``moto_server.key_policies``)."""
        s3, sns, sqs, dynamodb, kms = (self.client(s) for s in ("s3", "sns", "sqs", "dynamodb", "kms"))
        bucket, table = f"{name}-local", f"{name}-runs"
        s3.create_bucket(Bucket=bucket)
        # the deployed bucket's rules (infra/storage.py); moto stores them, slsml.local.lifecycle applies them
        rules = deployment_spec.lifecycle_configuration(deployment_spec.lifecycle_rules())
        s3.put_bucket_lifecycle_configuration(Bucket=bucket, LifecycleConfiguration=rules)
        # the deployed bucket's policy statements (infra/storage.py), enforced by moto_server.bucket_policies
        s3.put_bucket_policy(Bucket=bucket, Policy=json.dumps(bucket_policy(bucket)))
        dynamodb.create_table(**records.create_table_arguments(table))  # as infra/storage.py defines it
        dynamodb.update_time_to_live(
            TableName=table, TimeToLiveSpecification={"Enabled": True, "AttributeName": records.TTL_ATTRIBUTE}
        )
        topic_arns = {t.name: sns.create_topic(Name=f"{name}-{t.name}")["TopicArn"] for t in wiring.TOPICS}
        deployment = LocalDeployment(
            self.endpoint,
            bucket,
            table,
            topic_arns,
            access_key_id=self.credentials.access_key,
            secret_access_key=self.credentials.secret_key,
            identities={name: [made.access_key, made.secret_key] for name, made in self.identities.items()},
            signing_key=kms.create_key(Description=f"{name}: seals runs' signing keys")["KeyMetadata"]["Arn"],
        )
        kms.enable_key_rotation(KeyId=deployment.signing_key)
        kms.put_key_policy(KeyId=deployment.signing_key, PolicyName="default", Policy=json.dumps(key_policy()))
        for fn in wiring.FUNCTIONS:
            if fn.reads_dead_letters:
                continue
            dlq = sqs.create_queue(QueueName=f"{name}-{fn.name}-dlq")["QueueUrl"]
            dlq_arn = sqs.get_queue_attributes(QueueUrl=dlq, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
            queue = sqs.create_queue(
                QueueName=f"{name}-{fn.name}",
                Attributes={
                    "VisibilityTimeout": str(VISIBILITY_TIMEOUT_S),
                    "RedrivePolicy": json.dumps({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": MAX_RECEIVES}),
                },
            )["QueueUrl"]
            queue_arn = sqs.get_queue_attributes(QueueUrl=queue, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
            for topic in fn.triggers:
                attributes = {"RawMessageDelivery": "true"} if raw_delivery(fn) else {}
                sns.subscribe(
                    TopicArn=topic_arns[topic.name], Protocol="sqs", Endpoint=queue_arn, Attributes=attributes
                )
            if fn.queue is not None:  # the function's queue is the one its senders send to
                deployment.queue_urls[fn.queue.name] = queue
            deployment.queues[fn.name], deployment.dead_letter_queues[fn.name] = queue, dlq
            deployment.dead_letter_arns[fn.name] = dlq_arn
        s3.put_bucket_notification_configuration(
            Bucket=bucket,
            NotificationConfiguration={
                "TopicConfigurations": [
                    {
                        "TopicArn": topic_arns[n.topic.name],
                        "Events": ["s3:ObjectCreated:*"],
                        "Filter": {
                            "Key": {
                                "FilterRules": [
                                    {"Name": "prefix", "Value": n.prefix},
                                    {"Name": "suffix", "Value": n.suffix},
                                ]
                            }
                        },
                    }
                    for n in wiring.BUCKET_NOTIFICATIONS
                ]
            },
        )
        self._execute_state_machines()
        deployment.state_machine_arn = self.client("stepfunctions").create_state_machine(
            name=f"{name}-run",
            definition=json.dumps(
                orchestration.definition(
                    bucket, table, topic_arns[wiring.RUN_CONTROL.name], topic_arns[wiring.RUN_EVENTS.name]
                )
            ),
            roleArn="arn:aws:iam::123456789012:role/slsml-local-run",
        )["stateMachineArn"]
        return deployment

    def _execute_state_machines(self) -> None:
        """moto only records executions unless told to run them."""
        body = json.dumps({"stepfunctions": {"execute_state_machine": True}}).encode()
        self.call("POST", "/moto-api/config", body, {"Content-Type": "application/json"})


def owner(endpoint: str, credentials: Credentials) -> int | None:
    """The pid of the process whose embedded cloud serves at ``endpoint`` (a loopback address) and answers
    ``credentials``, or None where none does."""
    parts = urllib.parse.urlsplit(endpoint)
    if parts.scheme != "http" or parts.hostname != LOOPBACK or parts.path not in ("", "/"):
        return None
    asked = signed("GET", f"http://{LOOPBACK}:{parts.port}{OWNER_PATH}", credentials)
    try:
        with _DIRECT.open(asked, timeout=5) as answer:
            return int(json.load(answer)["pid"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def raw_delivery(fn: wiring.Function) -> bool:
    """A function fed by one topic takes its messages raw: SNS then spares the signed envelope (costly in
    the embedded cloud) and the host rebuilds it (``host.raw_body``)."""
    return fn.queue is None and len(fn.triggers) == 1


def use_deployment(deployment: LocalDeployment) -> None:
    """Point this process's AWS clients at the embedded cloud, signing with its credentials."""
    os.environ.update(deployment.environment())
    aws.use_credentials(deployment.credentials)


@contextmanager
def deployment_in_use(deployment: LocalDeployment) -> Iterator[None]:
    """``use_deployment`` for the block: after it, this process's variables and its session's credentials are
    those before it, so that a cloud stopped at its end leaves no clients made later signing for it (each cloud
    refuses others' credentials)."""
    with environment_set(deployment.environment()):
        replaced = aws.use_credentials(deployment.credentials)
        try:
            yield
        finally:
            aws.use_credentials(replaced)


@contextmanager
def environment_set(values: dict[str, str]) -> Iterator[None]:
    """This process's environment variables ``values`` for the block; after it, each as it was (unset if it was)."""
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
