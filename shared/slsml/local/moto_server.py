"""The embedded cloud's server: moto's application over kept-alive connections, with the lookups it repeats
on every request done once, and DynamoDB's writes atomic.

moto (5.2.5) lists its package folder to route each request, re-derives every handler class's method
names and converts the same camel-case names again and again, and finds the aliases of each response
field anew for every value it serializes. Each of these is a pure function of what it is given, so its
answers are kept: the responses are the same, served with less CPU. It also looks each of the ten members
of a DynamoDB attribute value up in every value of an item it returns; only the members a value holds are
looked up: a GetItem or UpdateItem of a 65-attribute item cost the server 5.0 ms of CPU, 2.6–3.6 after.
Its Step Functions tasks (the run state machine's DynamoDB, SNS and S3 calls) made a new client each (2.8 ms
of CPU); they share one per region and service.

DynamoDB applies each write to an item atomically; moto applies a request in Python on the thread of
its connection, so two UpdateItem ADDs to one item at once could count once (16 threads adding 4,000
times ended 1 to 3 short), and a barrier's counter would stop short of its workers until a deadline.
Its DynamoDB requests are therefore applied one at a time.

An SQS long poll returns a message as soon as it becomes visible, as SQS does. moto's wakes only when a
message is sent to the queue, or after 1 s: a message whose visibility timeout or delivery delay ended
meanwhile, or whose visibility was changed, waited up to 1 s more (a retry, a deadline, a dead letter).

A task answered with SendTaskFailure fails with the cause it was sent, as Step Functions fails it: moto's handler
dropped the cause, so a run's execution took a reported failure for an unexplained one.

moto's own server (werkzeug's development server) closes every connection after one response, so each
request opens a connection and starts a server thread. cheroot serves the same application from a pool of
threads over kept-alive connections: measured over S3 PUTs and GETs and DynamoDB UpdateItems from one
client, 0.90 ms of server CPU a request instead of 1.13, and 0.78 ms of the client's instead of 0.85. Its
environ carries what moto's request handler adds to werkzeug's: the request's path as sent, and the names of
S3 metadata headers with underscores as sent.

It is local: it listens on 127.0.0.1 alone and answers no web page. A request whose ``Host`` is not this
server's loopback address (a DNS-rebinding page), whose ``Origin`` is not this server's own, or that a
browser marks as sent from another site (``Sec-Fetch-Site``: scripts cannot set or drop it) is refused with
a 403 and no CORS header: a page the user opens can neither read nor change the runs and datasets it holds,
nor reach moto's management endpoints (``/moto-api/reset``). AWS clients send none of these headers.

It answers its owner alone: every request, moto's management endpoints and ``OWNER_PATH`` included, must be signed
with SigV4 (an ``Authorization`` header, or a pre-signed URL's query) by credentials the process that started it
handed it on its standard input, generated for this server and readable by its owner alone: the owner's (who alone
reaches the management endpoints), and one pair for each principal of the deployment (a function's role), whose
requests it serves as that principal's. The signature is recomputed by botocore's own signer from the request as
received, and a body must be the payload its ``X-Amz-Content-SHA256`` names (which the signature covers); a request
unsigned, signed with other credentials, altered after signing (its body too), or dated more than ``MAX_SKEW_S`` away
(a pre-signed URL: past its expiry) is refused with a 403: S3's XML error for S3, a JSON one otherwise. Another
user of the machine, who can connect to 127.0.0.1 as well, can neither read nor change what it holds. The key each
signature is computed with, derived from the secret by date, region and service, is derived once (``signing_key``).

A ranged S3 GET reads its bytes alone. moto read the whole object for each (from a temporary file, past
5 MB) and sliced the range out of it: a worker's ranged reads of a 64 MB dataset shard cost the server
64 MB each. A plain one (the kind the workers send for their samples, one per sample in the exact order, by
pre-signed URL) is answered from moto's S3 backend directly, with the headers moto's own answer has: routed
through moto's web application (Flask, its request parsing and S3's dispatch), it cost the server three times the
CPU (a worker's 32 samples: 34 ms against 11).

A bucket's policy is enforced as S3 enforces it: an object request that a Deny statement's action, resource and
conditions (the principal's among them) all match is refused (403 AccessDenied; an object of a DeleteObjects by
itself). moto evaluates a bucket policy with its conditions left out, so
it would refuse every PutObject that a conditioned Deny names (create-only's among them, ``If-None-Match`` or not);
its check is replaced. What is evaluated is what the deployed stack's policy uses (``POLICY_ACTIONS``,
``POLICY_CONDITIONS``); a policy with anything else is refused when put (MalformedPolicy), so that what is enforced
cannot drift silently from what is installed. Allow statements are not evaluated: they grant what every request of
the local cloud, its owner's, is granted already.

KMS keys' policies are enforced the same way (``key_policies``): a Decrypt, a ReEncrypt or a
GenerateDataKeyPairWithoutPlaintext that a Deny statement of its key's policy matches, with the request's principal
and encryption context as condition keys, is refused (AccessDeniedException). moto lacks
GenerateDataKeyPairWithoutPlaintext; it is added as KMS answers it (``kms_key_pairs``).

It lasts no longer than the process that started it: it ends when its standard input does (that
process's end of the pipe closes when it exits, however it exits). While it starts serving, it imports in
the background what the first request to each service would: the first CreateStateMachine alone imported
moto's Step Functions interpreter, 0.7 s.

Run as a script (``python moto_server.py -p PORT``, its standard input a pipe whose first line is the JSON of
``{"access_key_id": …, "secret_access_key": …, "arn": …, "others": [{…}, …]}``); it imports nothing of slsml.
"""

from __future__ import annotations

import argparse
import calendar
import functools
import hashlib
import hmac
import io
import json
import os
import re
import sys
import threading
import time
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from xml.sax.saxutils import escape as xml_escape

if TYPE_CHECKING:
    from botocore.credentials import Credentials

# Threads serving requests. Each long poll holds one for its wait: the local host keeps two per function
# (its queue, 1 s; its dead-letter queue, 5 s); a kept-alive connection holds none between requests.
SERVER_THREADS = 64
# Idle kept-alive connections the server keeps open (cheroot's default: 10, beyond which it closes each
# connection after its response). Every function process and the host keep a few: a run of W workers
# holds a few dozen to a few hundred, each an open socket and nothing more.
KEEP_ALIVE_CONNECTIONS = 4096
SERVICES = ("s3", "dynamodb", "sns", "sqs", "stepfunctions", "kms")  # what the embedded cloud serves
LOOPBACK = "127.0.0.1"
OWNER_PATH = "/slsml/owner"  # answers the pid of the process that started the server (who may act on it)
MANAGEMENT_PATHS = ("/moto-api/", OWNER_PATH)  # the owner's alone
PRINCIPAL_ARN = "aws:principalarn"  # the condition key naming who signed a request (IAM compares keys in lower case)


def tune() -> None:
    """Keep the answers of moto's per-request lookups (each a pure function of its arguments)."""
    from moto import backends
    from moto.core import responses, serialize, utils

    modules = tuple(backends.list_of_moto_modules())
    backends.list_of_moto_modules = lambda: modules  # the package's folders do not change while it runs

    camel = functools.lru_cache(maxsize=8192)(utils.camelcase_to_underscores)
    for module in list(sys.modules.values()):  # every module that imported it by name
        if getattr(module, "camelcase_to_underscores", None) is utils.camelcase_to_underscores:
            module.camelcase_to_underscores = camel
    utils.camelcase_to_underscores = camel

    methods = functools.lru_cache(maxsize=1024)(utils.method_names_from_class)  # classes do not change
    responses.method_names_from_class = methods

    picker = serialize.XFormedAttributePicker
    uncached = picker.get_possible_keys
    known: dict[tuple[Any, ...], tuple[str, ...]] = {}

    def possible_keys(self: Any, context: Any) -> Any:
        # the aliases of a plain dict's field depend on the picker's alias providers and the field's name
        # and shape alone (a dict has no Meta, and its class name is the same for all)
        if type(context.obj) is not dict:
            return uncached(self, context)
        found = (tuple(self.alias_providers), context.key, context.shape)  # shapes live as long as the server
        keys = known.get(found)
        if keys is None:
            keys = known[found] = tuple(uncached(self, context))
        return keys

    picker.get_possible_keys = possible_keys


def attribute_values() -> None:
    """Serialize a DynamoDB attribute value by the members it holds: moto looks each of the ten members of
    ``AttributeValue`` up in every value of every item it returns, though a plain dict value holds one."""
    from moto.core.serialize import BaseJSONSerializer

    every_member = BaseJSONSerializer._serialize_type_structure

    def structure(self: Any, serialized: Any, value: Any, shape: Any, key: str) -> None:
        # a member the dict lacks is None unless an alias of it is a key (the keys are members: none is) or
        # the serializer transforms its value (moto's DynamoDB serializer transforms none)
        if (
            shape.name != "AttributeValue"
            or type(value) is not dict
            or not value.keys() <= shape.members.keys()
            or getattr(self._value_picker, "response_transformers", None)
        ):
            return every_member(self, serialized, value, shape, key)
        wrapper = self.MAP_TYPE() if key else serialized
        for member_key, member_shape in shape.members.items():
            if member_key in value:
                member_shape.parent = shape
                self._serialize_structure_member(wrapper, value, member_shape, member_key)
        if key:
            self._default_serialize(serialized, wrapper, shape, key)

    BaseJSONSerializer._serialize_type_structure = structure


def task_clients(port: int, credentials: Credentials) -> None:
    """Step Functions' tasks call this server through one client per region and service, signed with its
    credentials: moto made a client (signed with credentials of its own), reading its service's model anew, for each
    task a state machine ran. A kept client reuses its kept-alive connections, which the server closes once idle for
    its ``timeout`` (10 s): a request sent on one as it closes fails with no answer (``ConnectionClosedError``), and
    is sent again as botocore's standard mode sends a failed request again (moto's, each on a connection of its own,
    tried once), as the service's own SDK does on AWS: a task fails on the service's answer, not on the transport."""
    import boto3
    from botocore.config import Config
    from moto.stepfunctions.parser.asl.component.common.timeouts.timeout import TimeoutSeconds
    from moto.stepfunctions.parser.asl.utils import boto_client

    made = boto_client.boto_client_for
    config = Config(  # moto's, but for its retries
        parameter_validation=False,
        retries={"mode": "standard", "total_max_attempts": 3},
        connect_timeout=TimeoutSeconds.DEFAULT_TIMEOUT_SECONDS,
        read_timeout=TimeoutSeconds.DEFAULT_TIMEOUT_SECONDS,
    )

    @functools.lru_cache(maxsize=64)
    def kept(region: str, service: str) -> Any:
        return boto3.client(
            service,
            region_name=region,
            endpoint_url=f"http://{LOOPBACK}:{port}",
            aws_access_key_id=credentials.access_key,
            aws_secret_access_key=credentials.secret_key,
            config=config,
        )

    def boto_client_for(region: str, service: str, state_credentials: Any = None) -> Any:
        return kept(region, service)  # moto's makes the same client whatever the state's credentials

    for module in list(sys.modules.values()):  # modules imported later import this one
        if getattr(module, "boto_client_for", None) is made:
            module.boto_client_for = boto_client_for


def serialize_dynamodb() -> None:
    """One DynamoDB request at a time: each reads, changes and writes moto's items as one step."""
    from moto.dynamodb.responses import DynamoHandler

    lock = threading.Lock()
    unlocked = DynamoHandler.call_action

    @functools.wraps(unlocked)
    def call_action(self: Any) -> Any:
        with lock:
            return unlocked(self)

    DynamoHandler.call_action = call_action


def task_failure_causes() -> None:
    """A task answered with SendTaskFailure fails with the error and the cause it was sent, as Step Functions fails it:
    moto's handler passed the error alone, so a state machine's Catch saw no ``Cause`` (the run's ``ExplainFailure``
    took a reported failure for an unexplained one)."""
    from moto.core.responses import EmptyResult
    from moto.stepfunctions.responses import StepFunctionResponse

    def send_task_failure(self: Any) -> Any:
        token, error, cause = (self._get_param(name) for name in ("taskToken", "error", "cause"))
        self.stepfunction_backend.send_task_failure(token, error=error, cause=cause)
        return EmptyResult()

    StepFunctionResponse.send_task_failure = send_task_failure


def wake_long_polls_when_due() -> None:
    """A long poll waits until a message is sent, or until the first message now invisible or delayed is
    due, or until its time is up; changing a message's visibility wakes the queue's polls."""
    from moto.core.utils import unix_time_millis
    from moto.sqs.models import Queue, SQSBackend

    def wait_for_messages(self: Any, timeout: float) -> None:
        end = unix_time_millis() + timeout * 1000
        with self._messages_lock:
            while not self.messages and (now := unix_time_millis()) < end:
                due = (when for m in self._messages if (when := max(m.visible_at, m.delayed_until)) > now)
                self._messages_lock.wait((min([end, *due]) - now) / 1000 + 0.001)  # visible once the clock passes it

    unchanged = SQSBackend.change_message_visibility

    @functools.wraps(unchanged)
    def change_message_visibility(self: Any, queue_name: str, *args: Any, **kwargs: Any) -> None:
        unchanged(self, queue_name, *args, **kwargs)
        queue = self.get_queue(queue_name)
        with queue._messages_lock:
            queue._messages_lock.notify_all()

    Queue.wait_for_messages = wait_for_messages
    SQSBackend.change_message_visibility = change_message_visibility


_RANGE = re.compile(r"bytes=(\d+)-(\d+)")


def _key_bytes(key: Any, begin: int, stop: int) -> bytes:
    """Bytes ``begin`` … ``stop - 1`` of moto's object ``key``, read alone from its buffer."""
    with key.lock:
        key._value_buffer.seek(begin)
        return key._value_buffer.read(stop - begin)


def ranged_reads() -> None:
    """A GET of one byte range ``bytes=A-B`` (A ≤ B) reads bytes A…B of the object, not the object: moto's
    get_object gets, instead of the object's bytes, a view that has its length and reads a slice on demand."""
    from moto.s3 import models, responses

    reading = threading.local()
    whole = models.FakeKey.value

    class Ranged:
        def __init__(self, key: Any) -> None:
            self.key = key

        def __len__(self) -> int:
            return self.key.contentsize

        def __getitem__(self, part: slice) -> bytes:  # the range response's slice [begin : end + 1]
            return _key_bytes(self.key, part.start, min(part.stop, self.key.contentsize))

    def value(key: Any) -> Any:
        return Ranged(key) if getattr(reading, "ranged", False) else whole.fget(key)

    models.FakeKey.value = property(value, whole.fset)
    unranged = responses.S3Response.get_object

    @functools.wraps(unranged)
    def get_object(self: Any) -> Any:
        match = _RANGE.fullmatch(self.headers.get("range") or "")
        reading.ranged = bool(match and int(match[1]) <= int(match[2]) and "partNumber" not in self.querystring)
        try:
            return unranged(self)
        finally:
            reading.ranged = False

    responses.S3Response.get_object = get_object


# the headers an SDK's GetObject sends (WSGI's names), beyond which a ranged GET is left to moto
_SDK_HEADERS = frozenset(
    f"HTTP_{name}"
    for name in (
        "HOST",
        "RANGE",
        "USER_AGENT",
        "ACCEPT_ENCODING",
        "AUTHORIZATION",
        "X_AMZ_DATE",
        "X_AMZ_CONTENT_SHA256",
        "X_AMZ_SECURITY_TOKEN",
        "AMZ_SDK_INVOCATION_ID",
        "AMZ_SDK_REQUEST",
        "CONNECTION",
        "X_AMZ_CHECKSUM_MODE",
    )
)
_PLAIN_OBJECT = re.compile(r"/(?P<bucket>[a-z0-9][a-z0-9.-]{1,61}[a-z0-9])/(?P<key>[A-Za-z0-9][A-Za-z0-9/._-]*)")
# the query of a URL pre-signed with SigV4 (slsml.aws.ranged): its signature's parameters and nothing else
_PRESIGNED = frozenset(
    f"X-Amz-{name}"
    for name in ("Algorithm", "Credential", "Date", "Expires", "SignedHeaders", "Signature", "Security-Token")
)


def _signature_only(query: str) -> bool:
    """Whether a query string is empty or holds a pre-signed URL's signature alone."""
    return all(part.partition("=")[0] in _PRESIGNED for part in query.split("&")) if query else True


def direct_ranged_gets(app: Any) -> Any:
    """``app``, with a plain ranged GET of an object answered from moto's S3 backend directly: path-style, no query
    but a pre-signed URL's signature (which moto does not check, as it checks no other), ``Range: bytes=A-B`` (A ≤ B,
    A within the object), the headers an SDK sends and no others, an object in no archive storage class, not the
    whole object, while moto records no requests. Its answer is moto's (the headers
    moto's get_object gives, the 206 of its range handling); any other request goes to ``app``."""
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.moto_api import recorder
    from moto.s3.models import s3_backends
    from moto.s3.utils import ARCHIVE_STORAGE_CLASSES
    from moto.utilities.aws_headers import gen_amzn_requestid_long

    def serve(environ: dict[str, Any], start_response: Any) -> Any:
        byte_range = _RANGE.fullmatch(environ.get("HTTP_RANGE", ""))
        where = _PLAIN_OBJECT.fullmatch(environ.get("RAW_URI", "").partition("?")[0])
        if (
            environ["REQUEST_METHOD"] != "GET"
            or byte_range is None
            or where is None
            or not _signature_only(environ.get("QUERY_STRING", ""))
            or any(name.startswith("HTTP_") and name not in _SDK_HEADERS for name in environ)
            or recorder._user_enabled  # moto records the requests it serves: the request log stays whole
        ):
            return app(environ, start_response)
        backend = s3_backends[DEFAULT_ACCOUNT_ID]["aws"]
        key = backend.get_object(where["bucket"], where["key"]) if where["bucket"] in backend.buckets else None
        begin, end = int(byte_range[1]), int(byte_range[2])
        if (
            key is None
            or key.storage_class in ARCHIVE_STORAGE_CLASSES
            or not begin <= end
            or begin >= key.size
            or (begin == 0 and end >= key.size - 1)  # the whole object, with its checksum
        ):
            return app(environ, start_response)  # moto's errors, and moto's answer to the rest
        end = min(end, key.size - 1)
        headers = {"x-amz-version-id": key.version_id} if key.version_id != "null" else {}
        headers.update(key.response_dict)
        headers.update(key.metadata)
        body = _key_bytes(key, begin, end + 1)
        headers |= {
            "Accept-Ranges": "bytes",
            "content-range": f"bytes {begin}-{end}/{key.size}",
            "content-length": str(len(body)),
            "x-amzn-requestid": gen_amzn_requestid_long(headers),
        }
        start_response("206 Partial Content", [(name, str(value)) for name, value in headers.items()])
        return [body]

    return serve


# What a bucket's or a KMS key's policy's Deny statements may name, each evaluated as S3 and KMS do: the actions
# (lower case: IAM compares them so) and, by condition operator, the condition keys
_DELETES = frozenset({"s3:deleteobject", "s3:deleteobjectversion"})
KMS_ACTIONS = frozenset({"kms:decrypt", "kms:encrypt", "kms:generatedatakeypairwithoutplaintext", "kms:reencryptfrom"})
POLICY_ACTIONS = frozenset({"s3:putobject"}) | _DELETES | KMS_ACTIONS
KIND_CONTEXT = "kms:encryptioncontext:kind"  # the encryption context's ``kind``, as a KMS condition key
POLICY_CONDITIONS = {
    "Null": frozenset({"s3:if-none-match"}),
    "Bool": frozenset({"s3:objectcreationoperation"}),
    "ArnNotEquals": frozenset({PRINCIPAL_ARN}),
    "ArnEquals": frozenset({PRINCIPAL_ARN}),
    "StringNotEquals": frozenset({KIND_CONTEXT}),
}
_OTHER_PUTS = frozenset({"acl", "tagging", "retention", "legal-hold"})  # subresources a PUT to is another action
_OTHER_DELETES = frozenset({"uploadId", "tagging"})  # AbortMultipartUpload, DeleteObjectTagging
_caller = threading.local()  # the principal (an ARN) whose request this thread serves: ``local_only`` sets it


@dataclass(frozen=True)
class Denial:
    """A Deny statement of a bucket policy: whom it names is everyone."""

    actions: frozenset[str]
    resources: re.Pattern[str]
    absent: tuple[tuple[str, frozenset[bool]], ...]  # Null conditions: a key, and whether its absence matches
    flags: tuple[tuple[str, frozenset[bool]], ...]  # Bool conditions: a key, and the values that match
    unlike: tuple[tuple[str, re.Pattern[str]], ...] = ()  # ArnNotEquals conditions: a key, and the ARNs that don't
    like: tuple[tuple[str, re.Pattern[str]], ...] = ()  # ArnEquals conditions: a key, and the ARNs that do
    other: tuple[tuple[str, frozenset[str]], ...] = ()  # StringNotEquals conditions: a key, and the values that don't


def _listed(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def _pattern(resources: list[str]) -> re.Pattern[str]:
    """The ARNs the patterns (``*``: any characters, ``?``: one) match."""
    globs = (re.escape(r).replace(r"\*", ".*").replace(r"\?", ".") for r in resources)
    return re.compile("|".join(f"(?:{glob})" for glob in globs), re.DOTALL)


def _truths(operator: str, values: Any) -> frozenset[bool]:
    """The values of a Null or Bool condition: true or false (a JSON boolean or a string, in any case)."""
    checked = [v if isinstance(v, bool) else str(v).lower() for v in _listed(values)]
    if not all(v in (True, False, "true", "false") for v in checked):
        raise ValueError(f"a {operator} condition takes true or false, not {values!r}")
    return frozenset(v in (True, "true") for v in checked)


def denials(document: bytes) -> tuple[Denial, ...]:
    """The Deny statements of the bucket's or key's policy ``document``; ValueError naming what of it the local cloud
    does not evaluate."""
    denied = []
    for statement in _listed(json.loads(document)["Statement"]):
        unknown = statement.keys() - {"Sid", "Effect", "Principal", "Action", "Resource", "Condition"}
        if unknown:
            raise ValueError(f"the local cloud does not evaluate a policy statement's {sorted(unknown)}")
        if statement["Effect"] == "Allow":
            continue
        principal = statement.get("Principal")
        if principal not in ("*", {"AWS": "*"}, {"AWS": ["*"]}):
            raise ValueError(f"the local cloud evaluates Deny statements for every principal, not for {principal!r}")
        actions = _listed(statement["Action"])
        others = [action for action in actions if action.lower() not in POLICY_ACTIONS]
        if others:
            raise ValueError(f"the local cloud does not tell apart the actions {others}")
        evaluated: dict[str, list[tuple[str, frozenset[bool]]]] = {"Null": [], "Bool": []}
        arns: dict[str, list[tuple[str, re.Pattern[str]]]] = {"ArnNotEquals": [], "ArnEquals": []}
        other: list[tuple[str, frozenset[str]]] = []
        for operator, conditions in statement.get("Condition", {}).items():
            keys = POLICY_CONDITIONS.get(operator)
            if keys is None:
                raise ValueError(f"the local cloud does not evaluate the condition operator {operator}")
            for key, values in conditions.items():
                if key.lower() not in keys:
                    raise ValueError(f"the local cloud does not evaluate the condition key {key} with {operator}")
                if operator in arns:
                    arns[operator].append((key.lower(), _pattern([str(value) for value in _listed(values)])))
                elif operator == "StringNotEquals":
                    other.append((key.lower(), frozenset(str(value) for value in _listed(values))))
                else:
                    evaluated[operator].append((key.lower(), _truths(operator, values)))
        resources = _pattern(_listed(statement["Resource"]))
        actions_named = frozenset(a.lower() for a in actions)
        denied.append(
            Denial(
                actions_named,
                resources,
                tuple(evaluated["Null"]),
                tuple(evaluated["Bool"]),
                tuple(arns["ArnNotEquals"]),
                tuple(arns["ArnEquals"]),
                tuple(other),
            )
        )
    return tuple(denied)


def object_request(
    method: str, query: Mapping[str, Any], headers: Mapping[str, str]
) -> tuple[str, dict[str, str]] | None:
    """The action a request on an object is authorized as, with the condition keys it carries (but the principal's,
    ``PRINCIPAL_ARN``), where it is one of ``POLICY_ACTIONS``; else None. A DeleteObject is an ``s3:DeleteObject`` (of
    a version: ``s3:DeleteObjectVersion``), carrying none. A PutObject, CopyObject, UploadPart (a copy or not),
    CreateMultipartUpload or CompleteMultipartUpload is an ``s3:PutObject``; the PutObject and the
    CompleteMultipartUpload alone carry ``s3:if-none-match`` (S3 refuses a copy into a key whose writes must carry
    it). Each carries
    ``s3:objectcreationoperation``: "true" where it creates the object (a PutObject, a CopyObject, a
    CompleteMultipartUpload), "false" where it does not (a CreateMultipartUpload, an UploadPart, an UploadPartCopy)."""
    if method == "DELETE" and not query.keys() & _OTHER_DELETES:
        return ("s3:DeleteObjectVersion" if "versionId" in query else "s3:DeleteObject"), {}
    if method == "PUT" and not query.keys() & _OTHER_PUTS:
        part = "partNumber" in query
        conditional, creating = not part and "x-amz-copy-source" not in headers, not part
    elif method == "POST" and ("uploads" in query or "uploadId" in query):
        conditional = creating = "uploadId" in query
    else:
        return None
    context = {"s3:objectcreationoperation": "true" if creating else "false"}
    condition = headers.get("If-None-Match")
    if conditional and condition is not None:
        context["s3:if-none-match"] = condition
    return "s3:PutObject", context


def denied(policy: tuple[Denial, ...], action: str, resource: str, context: Mapping[str, str]) -> bool:
    """Whether a Deny statement of ``policy`` refuses ``action`` on ``resource`` with the condition keys ``context``
    (all its conditions match: a Bool or ArnEquals condition on a key the request does not carry matches none of its
    values; an ArnNotEquals or StringNotEquals condition matches a key the request does not carry, as IAM's negated
    operators do)."""
    return any(
        action.lower() in denial.actions
        and denial.resources.fullmatch(resource) is not None
        and all((key not in context) in matches for key, matches in denial.absent)
        and all(key in context and (context[key].lower() == "true") in matches for key, matches in denial.flags)
        and all(key not in context or arns.fullmatch(context[key]) is None for key, arns in denial.unlike)
        and all(key in context and arns.fullmatch(context[key]) is not None for key, arns in denial.like)
        and all(context.get(key) not in values for key, values in denial.other)
        for denial in policy
    )


def _principal() -> dict[str, str]:
    """The condition key naming the principal whose request this thread serves (none where it is not known)."""
    arn = getattr(_caller, "arn", None)
    return {PRINCIPAL_ARN: arn} if arn else {}


def bucket_policies() -> None:
    """Refuse an object request that the bucket's policy denies (``denied``), each object of a DeleteObjects among
    them, and a policy with what ``denials`` does not evaluate when it is put; moto's own check, which leaves
    conditions and principals out, is not made."""
    from moto.iam.access_control import PermissionResult
    from moto.s3 import models, responses
    from moto.s3.exceptions import S3ClientError

    parsed = functools.lru_cache(maxsize=64)(denials)  # a bucket's policy, as stored: bytes
    installing = models.S3Backend.put_bucket_policy

    def put_bucket_policy(self: Any, bucket_name: str, policy: bytes) -> None:
        try:
            parsed(policy)
        except (ValueError, KeyError, TypeError, AttributeError) as error:
            raise S3ClientError("MalformedPolicy", f"{type(error).__name__}: {error}") from None
        installing(self, bucket_name, policy)

    unchecked = responses.S3Response._key_response

    def _key_response(self: Any, request: Any, full_url: str) -> Any:
        bucket = self.backend.buckets.get(self.bucket_name)
        found = (
            None
            if bucket is None or bucket.policy is None
            else object_request(request.method, self.querystring, request.headers)
        )
        if found is not None:
            resource = f"arn:aws:s3:::{bucket.name}/{self.parse_key_name()}"
            action, context = found
            if denied(parsed(bucket.policy), action, resource, context | _principal()):
                raise S3ClientError(
                    "AccessDenied",
                    f'not authorized to perform: {action} on resource: "{resource}" with an explicit deny in a '
                    "resource-based policy",
                )
        return unchecked(self, request, full_url)

    def get_permission(self: Any, action: str, resource: str) -> Any:
        # what moto asks of each object a DeleteObjects names; of a key's request, which _key_response checked (an
        # AbortMultipartUpload as a DeleteObject among them), it answers nothing
        if self.policy is None or not getattr(_caller, "deleting", False):
            return PermissionResult.NEUTRAL
        refused = denied(parsed(self.policy), action, resource, _principal())
        return PermissionResult.DENIED if refused else PermissionResult.NEUTRAL

    each_key = responses.S3Response._bucket_response_delete_keys

    @functools.wraps(each_key)
    def _bucket_response_delete_keys(self: Any, *args: Any, **kwargs: Any) -> Any:
        _caller.deleting = True
        try:
            return each_key(self, *args, **kwargs)
        finally:
            _caller.deleting = False

    models.S3Backend.put_bucket_policy = put_bucket_policy
    models.FakeBucket.get_permission = get_permission
    responses.S3Response._bucket_response_delete_keys = _bucket_response_delete_keys
    responses.S3Response._key_response = _key_response


def kms_key_pairs() -> None:
    """KMS's GenerateDataKeyPairWithoutPlaintext, which moto lacks, as KMS answers it: an ECC_NIST_P256 key pair made
    here, its public key (DER) and its private key (PKCS #8 DER) sealed under the key named with the encryption context
    given; the private key itself is returned to no one."""
    import base64

    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from moto.kms.exceptions import ValidationException
    from moto.kms.responses import KmsResponse

    def generate_data_key_pair_without_plaintext(self: Any) -> str:
        key_id, spec = self._get_param("KeyId"), self._get_param("KeyPairSpec")
        if spec != "ECC_NIST_P256":
            raise ValidationException(f"the local cloud makes ECC_NIST_P256 key pairs, not {spec}")
        self._validate_key_id(key_id)
        made = ec.generate_private_key(ec.SECP256R1())
        private = made.private_bytes(
            serialization.Encoding.DER, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        public = made.public_key().public_bytes(
            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
        )
        sealed, arn = self.kms_backend.encrypt(
            key_id=key_id, plaintext=private, encryption_context=self._get_param("EncryptionContext", {})
        )
        return json.dumps(
            {
                "KeyId": arn,
                "KeyPairSpec": spec,
                "PrivateKeyCiphertextBlob": base64.b64encode(sealed).decode(),
                "PublicKey": base64.b64encode(public).decode(),
            }
        )

    KmsResponse.generate_data_key_pair_without_plaintext = generate_data_key_pair_without_plaintext


def key_policies() -> None:
    """Refuse a KMS request that its key's policy denies (``denied``: the request's principal and encryption context
    its condition keys), for the actions that read or make sealed key material (``KMS_ACTIONS``), and a policy with
    what ``denials`` does not evaluate when it is put; moto evaluates no key policy's conditions."""
    from moto.kms import models, responses
    from moto.kms.exceptions import AccessDeniedException, ValidationException

    parsed = functools.lru_cache(maxsize=64)(denials)
    installing = models.KmsBackend.put_key_policy

    def put_key_policy(self: Any, key_id: str, policy: str) -> None:
        try:
            parsed(policy.encode())
        except (ValueError, KeyError, TypeError, AttributeError) as error:
            raise ValidationException(f"MalformedPolicyDocument: {type(error).__name__}: {error}") from None
        installing(self, key_id, policy)

    def check(backend: Any, key_id: str, action: str, context: Mapping[str, str]) -> None:
        key = backend.keys[backend.any_id_to_key_id(key_id)]
        keys = {f"kms:encryptioncontext:{name}".lower(): str(value) for name, value in context.items()}
        if denied(parsed(key.policy.encode()), action, key.arn, keys | _principal()):
            raise AccessDeniedException(
                f"not authorized to perform: {action} on resource: {key.arn} with an explicit deny in a"
                " resource-based policy"
            )

    unsealing = models.KmsBackend.decrypt

    def decrypt(self: Any, ciphertext_blob: bytes, encryption_context: dict[str, str], key_id: Any = None) -> Any:
        plaintext, arn = unsealing(self, ciphertext_blob, encryption_context, key_id)
        check(self, arn, "kms:Decrypt", encryption_context)
        return plaintext, arn

    resealing = models.KmsBackend.re_encrypt

    def re_encrypt(self: Any, ciphertext_blob: bytes, source_encryption_context: dict[str, str], *args: Any) -> Any:
        _, arn = unsealing(self, ciphertext_blob, source_encryption_context)
        check(self, arn, "kms:ReEncryptFrom", source_encryption_context)
        return resealing(self, ciphertext_blob, source_encryption_context, *args)

    making = responses.KmsResponse.generate_data_key_pair_without_plaintext
    sealing = responses.KmsResponse.encrypt

    def encrypt(self: Any) -> str:  # the request (a key pair's sealing is of the request that makes it)
        check(self.kms_backend, self._get_param("KeyId"), "kms:Encrypt", self._get_param("EncryptionContext", {}))
        return sealing(self)

    def generate_data_key_pair_without_plaintext(self: Any) -> str:
        context = self._get_param("EncryptionContext", {})
        check(self.kms_backend, self._get_param("KeyId"), "kms:GenerateDataKeyPairWithoutPlaintext", context)
        return making(self)

    models.KmsBackend.put_key_policy = put_key_policy
    models.KmsBackend.decrypt = decrypt
    models.KmsBackend.re_encrypt = re_encrypt
    responses.KmsResponse.generate_data_key_pair_without_plaintext = generate_data_key_pair_without_plaintext
    responses.KmsResponse.encrypt = encrypt


def end_with_parent() -> None:
    """End this process once its standard input ends: the parent that holds the pipe has exited."""

    def watch() -> None:
        while sys.stdin.buffer.read(4096):
            pass
        os._exit(0)

    threading.Thread(target=watch, name="parent", daemon=True).start()


def import_services() -> None:
    """Import, in the background, each service's backend and the Step Functions interpreter that runs
    the state machine's executions. The interpreter's AWS Batch task takes one enumeration from ``moto.batch``,
    whose package imports moto's Batch and EC2 models (their instance types and zones: 0.55 s of CPU of the 0.8 the
    imports take); the package is made without running its ``__init__``, so that only that module is read (the
    embedded cloud serves no Batch)."""

    def load() -> None:
        import importlib.util

        from moto import backends

        batch = importlib.util.find_spec("moto.batch")
        if batch is not None and "moto.batch" not in sys.modules:
            sys.modules["moto.batch"] = importlib.util.module_from_spec(batch)

        for service in SERVICES:
            backends.get_backend(service)
        import moto.stepfunctions.parser.models  # noqa: F401

    threading.Thread(target=load, name="imports", daemon=True).start()


def refusal(environ: dict[str, Any], port: int) -> str | None:
    """Why a request is refused, or None: one a web page sent, or one addressed to another host."""
    host = environ.get("HTTP_HOST", "")
    name, _, at = host.rpartition(":")
    if at != str(port) or not (name in (LOOPBACK, "localhost") or name.endswith(".localhost")):
        return f"the local cloud answers requests for {LOOPBACK}:{port} only, not for {host!r}"
    origin = environ.get("HTTP_ORIGIN")
    if origin is not None and origin not in (f"http://{LOOPBACK}:{port}", f"http://localhost:{port}"):
        return f"the local cloud answers no web page: cross-origin request from {origin!r} refused"
    site = environ.get("HTTP_SEC_FETCH_SITE")
    if site is not None and site not in ("same-origin", "none"):
        return f"the local cloud answers no web page: request from a {site} page refused"
    return None


MAX_SKEW_S = 900  # how far a signed request's time may lie from the server's clock, as AWS allows
MAX_EXPIRES_S = 7 * 24 * 3600  # the longest a pre-signed URL lasts, as AWS allows
ALGORITHM = "AWS4-HMAC-SHA256"
_AUTHORIZATION = re.compile(
    ALGORITHM + r" Credential=(?P<credential>[^,\s]+),\s*SignedHeaders=(?P<headers>[a-z0-9;_.-]+),"
    r"\s*Signature=(?P<signature>[0-9a-f]{64})"
)
_TIMESTAMP = re.compile(r"(\d{4})(\d\d)(\d\d)T(\d\d)(\d\d)(\d\d)Z")  # SigV4's: botocore.auth.SIGV4_TIMESTAMP
_SCOPE = re.compile(r"Credential=[^/&]*/\d{8}/[^/&]*/(?P<service>[^/&]+)/aws4_request")


class Refused(Exception):
    """A request its signature does not admit: the error codes S3 and the JSON services give, and why."""

    def __init__(self, s3_code: str, json_code: str, message: str) -> None:
        super().__init__(message)
        self.s3_code, self.json_code, self.message = s3_code, json_code, message


def _unsigned(why: str) -> Refused:
    return Refused(
        "AccessDenied",
        "MissingAuthenticationTokenException",
        f"{why}: the local cloud answers requests signed with its credentials alone (`slsml local env` prints them)",
    )


def _mismatch(why: str) -> Refused:
    return Refused("SignatureDoesNotMatch", "InvalidSignatureException", why)


@dataclass(frozen=True)
class Signature:
    """What a request says of its SigV4 signature."""

    access_key: str
    date: str  # of its scope: YYYYMMDD
    region: str
    service: str
    headers: tuple[str, ...]  # the names of the headers signed, lower case
    signature: str  # hex
    timestamp: str  # X-Amz-Date: YYYYMMDDTHHMMSSZ
    expires_s: int | None  # a pre-signed URL's lifetime; None: signed in its Authorization header


def claimed(environ: Mapping[str, Any]) -> Signature:
    """The signature a request carries, in its ``Authorization`` header or its pre-signed URL's query; Refused where
    it carries none or one of another form."""
    query = environ.get("QUERY_STRING", "")
    authorization = environ.get("HTTP_AUTHORIZATION")
    expires: int | None = None
    if authorization is not None:
        found = _AUTHORIZATION.fullmatch(authorization.strip())
        if found is None:
            raise _unsigned(f"its Authorization header is not an {ALGORITHM} signature")
        credential, names, signature = found["credential"], found["headers"], found["signature"]
        timestamp = environ.get("HTTP_X_AMZ_DATE", "")
    elif "X-Amz-Signature=" in query:
        params = urllib.parse.parse_qs(query, keep_blank_values=True)

        def one(name: str) -> str:
            values = params.get(f"X-Amz-{name}", [])
            return values[0] if len(values) == 1 else ""

        if one("Algorithm") != ALGORITHM or not one("Expires").isdigit():
            raise _unsigned(f"its pre-signed URL is not signed with {ALGORITHM}")
        credential, names, signature = one("Credential"), one("SignedHeaders"), one("Signature")
        timestamp, expires = one("Date"), int(one("Expires"))
    else:
        raise _unsigned("it is not signed")
    scope = credential.split("/")
    if len(scope) != 5 or scope[4] != "aws4_request":
        raise _unsigned(f"its credential scope {credential!r} is not ACCESS_KEY/DATE/REGION/SERVICE/aws4_request")
    access_key, date, region, service = scope[:4]
    return Signature(access_key, date, region, service, tuple(names.split(";")), signature, timestamp, expires)


@functools.lru_cache(maxsize=64)
def signing_key(secret: str, date: str, region: str, service: str) -> bytes:
    """The key SigV4 signs a day's requests to a region's service with, derived from the secret key."""
    key = f"AWS4{secret}".encode()
    for part in (date, region, service, "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    return key


def _header(environ: Mapping[str, Any], name: str) -> str | None:
    """The value of the request's header ``name`` (lower case), as received."""
    if name in ("content-type", "content-length"):
        return environ.get(name.upper().replace("-", "_"))
    return environ.get("HTTP_" + name.upper().replace("-", "_"))


def _signer(signature: Signature, credentials: Credentials) -> Any:
    """botocore's SigV4 signer of the kind that signed the request: S3's or another service's, by header or by
    pre-signed URL."""
    from botocore import auth

    if signature.expires_s is None:
        kind = auth.S3SigV4Auth if signature.service == "s3" else auth.SigV4Auth
        return kind(credentials, signature.service, signature.region)
    kind = auth.S3SigV4QueryAuth if signature.service == "s3" else auth.SigV4QueryAuth
    return kind(credentials, signature.service, signature.region, expires=signature.expires_s)


def needs_body(signature: Signature) -> bool:
    """Whether the signature covers the request's body itself: one signed in its header whose payload hash is not
    sent beside it (``X-Amz-Content-SHA256``, which every S3 request carries)."""
    return signature.expires_s is None and "x-amz-content-sha256" not in signature.headers


UNSIGNED_PAYLOADS = ("UNSIGNED-PAYLOAD", "STREAMING-UNSIGNED-PAYLOAD-TRAILER")  # a payload hash that covers no body


def verify(
    environ: Mapping[str, Any],
    known: Mapping[str, Credentials],
    now: float,
    body: Callable[[], bytes] = bytes,
) -> Signature:
    """The request's signature, if the credentials of its access key (``known``: by access key) made it for this
    request (its method, path, query, signed headers and, where ``needs_body``, its ``body()``) within ``MAX_SKEW_S``
    of ``now`` (a pre-signed URL: before it expires), and its ``body()`` is the payload its ``X-Amz-Content-SHA256``
    names (which the signature covers); else Refused. The signature is recomputed by botocore's signer from the
    request rebuilt as received."""
    from botocore.awsrequest import AWSRequest

    signature, read = claimed(environ), functools.cache(body)
    credentials = known.get(signature.access_key)
    if credentials is None:
        raise Refused(
            "InvalidAccessKeyId",
            "UnrecognizedClientException",
            f"the access key {signature.access_key!r} is not this local cloud's (`slsml local env` prints its own)",
        )
    stamp = _TIMESTAMP.fullmatch(signature.timestamp)
    if stamp is None:
        raise _mismatch(f"its time {signature.timestamp!r} is not of the form YYYYMMDDTHHMMSSZ")
    signed_at = calendar.timegm(tuple(int(part) for part in stamp.groups()))
    if signature.expires_s is None and abs(now - signed_at) > MAX_SKEW_S:
        raise Refused(
            "RequestTimeTooSkewed",
            "InvalidSignatureException",
            f"signed at {signature.timestamp}, more than {MAX_SKEW_S} s from the local cloud's time",
        )
    if signature.expires_s is not None and not (
        signature.expires_s <= MAX_EXPIRES_S and signed_at - MAX_SKEW_S <= now <= signed_at + signature.expires_s
    ):
        raise Refused("AccessDenied", "InvalidSignatureException", "the pre-signed URL has expired")
    if signature.timestamp[:8] != signature.date:
        raise _mismatch(f"its scope's date {signature.date} is not the day it was signed, {signature.timestamp}")
    uri = environ.get("REQUEST_URI", "")
    if signature.expires_s is not None:  # its query without the signature: what was signed
        path, _, query = uri.partition("?")
        uri = path + "?" + "&".join(p for p in query.split("&") if not p.startswith("X-Amz-Signature="))
    headers = {}
    for name in signature.headers:
        value = _header(environ, name)
        if value is None:
            raise _mismatch(f"its signed header {name!r} is not in the request")
        headers[name] = value
    request = AWSRequest(
        method=environ["REQUEST_METHOD"],
        url=f"http://{environ.get('HTTP_HOST', '')}{uri}",
        headers=headers,
        data=read() if needs_body(signature) else b"",
    )
    request.context["timestamp"] = signature.timestamp
    signer = _signer(signature, credentials)
    string_to_sign = signer.string_to_sign(request, signer.canonical_request(request))
    key = signing_key(credentials.secret_key, signature.date, signature.region, signature.service)
    if not hmac.compare_digest(hmac.new(key, string_to_sign.encode(), hashlib.sha256).hexdigest(), signature.signature):
        raise _mismatch("the signature computed for the request does not match the one it carries")
    payload = _header(environ, "x-amz-content-sha256")
    if payload is not None and payload not in UNSIGNED_PAYLOADS:
        if payload.startswith("STREAMING-"):
            raise _mismatch(f"the local cloud does not verify a payload signed by chunks ({payload})")
        if not hmac.compare_digest(hashlib.sha256(read()).hexdigest(), payload.lower()):
            raise Refused(
                "XAmzContentSHA256Mismatch",
                "InvalidSignatureException",
                "its body is not the payload it was signed for: X-Amz-Content-SHA256 is not the SHA-256 of its body",
            )
    return signature


def _read_body(environ: dict[str, Any]) -> bytes:
    """The request's body, read whole; the application reads it again from ``environ``."""
    stream, length = environ["wsgi.input"], environ.get("CONTENT_LENGTH")
    body = stream.read(int(length)) if length else stream.read() if environ.get("wsgi.input_terminated") else b""
    environ["wsgi.input"] = io.BytesIO(body)
    return body


def _protocol(environ: Mapping[str, Any]) -> str:
    """How the service a refused request was sent to answers errors: ``query`` (a form POSTed to SNS's query API),
    ``s3`` (a request its credential scope names S3, or, unsigned, one for no other service nor the management
    endpoints), or ``json`` (DynamoDB's, SQS's, Step Functions', the management endpoints')."""
    path = environ.get("PATH_INFO", "")
    form = environ.get("CONTENT_TYPE", "").startswith("application/x-www-form-urlencoded")
    if environ["REQUEST_METHOD"] == "POST" and form and "HTTP_X_AMZ_TARGET" not in environ:
        return "query"
    scope = _SCOPE.search(environ.get("HTTP_AUTHORIZATION") or urllib.parse.unquote(environ.get("QUERY_STRING", "")))
    if scope is not None:
        return "s3" if scope["service"] == "s3" else "json"
    others = "HTTP_X_AMZ_TARGET" in environ or path.startswith(("/moto-api/", OWNER_PATH))
    return "json" if others or (environ["REQUEST_METHOD"] == "POST" and path == "/") else "s3"


def _refusal_response(environ: Mapping[str, Any], refused: Refused) -> tuple[list[tuple[str, str]], bytes]:
    """The 403's headers and body: S3's XML error, the query API's, or the JSON services'."""
    message = xml_escape(refused.message)
    protocol = _protocol(environ)
    if protocol == "json":
        body = json.dumps({"__type": refused.json_code, "message": refused.message}).encode()
        return [("Content-Type", "application/x-amz-json-1.0")], body
    if protocol == "s3":
        error = f"<Error><Code>{refused.s3_code}</Code><Message>{message}</Message></Error>"
    else:
        error = (
            f"<ErrorResponse><Error><Type>Sender</Type><Code>{refused.json_code.removesuffix('Exception')}</Code>"
            f"<Message>{message}</Message></Error></ErrorResponse>"
        )
    return [("Content-Type", "text/xml")], f'<?xml version="1.0" encoding="UTF-8"?>\n{error}'.encode()


@dataclass(frozen=True)
class Principal:
    """Whom a request signed with ``credentials`` comes from: ``arn``, as a bucket policy names it."""

    credentials: Credentials
    arn: str


@dataclass(frozen=True)
class Identities:
    """Whom the server answers: its owner (who alone reaches ``MANAGEMENT_PATHS``) and the others it was handed
    (the local deployment's functions, each a principal of its own), by access key."""

    owner: Principal
    others: tuple[Principal, ...] = ()

    @functools.cached_property
    def by_key(self) -> dict[str, Principal]:
        return {p.credentials.access_key: p for p in (self.owner, *self.others)}

    @functools.cached_property
    def credentials(self) -> dict[str, Credentials]:
        return {key: principal.credentials for key, principal in self.by_key.items()}


def local_only(app: Any, port: int, identities: Identities) -> Any:
    """``app`` behind ``refusal``'s checks and ``verify``'s with the credentials of ``identities``, serving each
    request as its principal (``_caller``); it also answers ``OWNER_PATH``."""

    def guarded(environ: dict[str, Any], start_response: Any) -> Any:
        refused = refusal(environ, port)
        if refused is not None:
            start_response("403 Forbidden", [("Content-Type", "text/plain"), ("Vary", "Origin")])
            return [refused.encode()]
        try:
            signature = verify(environ, identities.credentials, time.time(), lambda: _read_body(environ))
            principal = identities.by_key[signature.access_key]
            if environ.get("PATH_INFO", "").startswith(MANAGEMENT_PATHS) and principal != identities.owner:
                raise Refused("AccessDenied", "AccessDeniedException", f"{principal.arn} may not manage the server")
        except Refused as denied:
            headers, body = _refusal_response(environ, denied)
            start_response("403 Forbidden", [*headers, ("Content-Length", str(len(body)))])
            return [body]
        if environ.get("PATH_INFO") == OWNER_PATH:
            start_response("200 OK", [("Content-Type", "application/json")])
            return [json.dumps({"pid": os.getppid()}).encode()]
        _caller.arn = principal.arn
        try:
            return app(environ, start_response)
        finally:
            _caller.arn = None

    return guarded


def gateway() -> type:
    """cheroot's WSGI gateway, with the environ entries moto's request handler adds to werkzeug's."""
    from cheroot import wsgi
    from moto.core.request import (
        PRESERVED_HEADER_NAMES_ENVIRON_KEY,
        environ_key_for_header,
        should_preserve_original_header_name,
    )

    class MotoGateway(wsgi.Gateway_10):
        def get_environ(self) -> dict[str, Any]:
            environ = super().get_environ()
            environ["RAW_URI"] = environ["REQUEST_URI"]  # moto matches S3 keys against the path as sent
            names = (name.decode("latin-1") for name in self.req.inheaders)
            environ[PRESERVED_HEADER_NAMES_ENVIRON_KEY] = {  # WSGI folds "_" and "-" in header names into one
                environ_key_for_header(name): name for name in names if should_preserve_original_header_name(name)
            }
            return environ

    return MotoGateway


def given_identities() -> Identities:
    """Whom the server answers: the first line of standard input."""
    from botocore.credentials import Credentials

    def principal(given: dict[str, Any]) -> Principal:
        return Principal(Credentials(str(given["access_key_id"]), str(given["secret_access_key"])), str(given["arn"]))

    try:
        given = json.loads(sys.stdin.buffer.readline())
        return Identities(principal(given), tuple(principal(other) for other in given.get("others", ())))
    except (ValueError, KeyError, TypeError, AttributeError):
        sys.exit(
            'the first line of standard input must be {"access_key_id": …, "secret_access_key": …, "arn": …,'
            ' "others": [{"access_key_id": …, "secret_access_key": …, "arn": …}, …]}'
        )


def main() -> None:
    parser = argparse.ArgumentParser(description="moto's server, tuned")
    parser.add_argument("-p", "--port", type=int, required=True)
    args = parser.parse_args()
    identities = given_identities()
    os.environ["MOTO_PORT"] = str(args.port)  # where moto's Step Functions tasks call AWS: this server
    os.environ["MOTO_DISABLE_GLOBAL_CORS"] = "true"  # moto's CORS would echo any Origin
    end_with_parent()
    tune()
    attribute_values()
    task_clients(args.port, identities.owner.credentials)
    serialize_dynamodb()
    task_failure_causes()
    wake_long_polls_when_due()
    ranged_reads()
    bucket_policies()
    kms_key_pairs()
    key_policies()
    from cheroot import wsgi
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app

    app = local_only(direct_ranged_gets(DomainDispatcherApplication(create_backend_app)), args.port, identities)
    server = wsgi.Server((LOOPBACK, args.port), app, numthreads=SERVER_THREADS, request_queue_size=128)
    server.gateway = gateway()
    server.keep_alive_conn_limit = KEEP_ALIVE_CONNECTIONS
    import_services()
    server.safe_start()


if __name__ == "__main__":
    main()
