"""The embedded cloud's tuned moto server: the lookups it keeps give the answers moto's own give, and the
responses of the services the pipeline uses are the same; the bucket policies it enforces are evaluated as S3 does,
and one it could not evaluate is refused. It runs in a child process, so that this
process's moto stays as it is."""

from __future__ import annotations

import datetime as dt
import json
import re
import subprocess
import sys
import textwrap
import urllib.parse
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from botocore.auth import S3SigV4Auth, S3SigV4QueryAuth, SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.config import Config
from botocore.credentials import Credentials

import slsml.local.moto_server
from slsml.local import cloud
from slsml.local.moto_server import (
    MAX_SKEW_S,
    PRINCIPAL_ARN,
    Refused,
    denials,
    denied,
    object_request,
    signing_key,
    verify,
)
from slsml.spec import deployment, keys, wiring

CHECK = textwrap.dedent(
    """
    import json, sys
    import boto3
    from moto import mock_aws

    def responses():
        with mock_aws():
            ddb = boto3.client("dynamodb", region_name="us-east-1")
            ddb.create_table(TableName="t", BillingMode="PAY_PER_REQUEST",
                             KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
                             AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}])
            out = []
            for n in range(3):
                out.append(ddb.update_item(
                    TableName="t", Key={"pk": {"S": "a"}}, UpdateExpression="ADD c :one SET m = :m, l = :l, s = :s",
                    ExpressionAttributeValues={":one": {"N": "1"}, ":m": {"M": {"x": {"N": str(n)}, "b": {"B": b"0"}}},
                                               ":l": {"L": [{"S": "s"}, {"BOOL": True}, {"NULL": True}]},
                                               ":s": {"L": [{"SS": ["a", "b"]}, {"NS": ["1", "2.5"]},
                                                            {"BS": [b"x", b"y"]}, {"M": {}}, {"L": []}]}},
                    ReturnValues="ALL_NEW")["Attributes"])
            out.append(ddb.get_item(TableName="t", Key={"pk": {"S": "a"}}, ConsistentRead=True)["Item"])
            sqs = boto3.client("sqs", region_name="us-east-1")
            url = sqs.create_queue(QueueName="q")["QueueUrl"]
            sqs.send_message(QueueUrl=url, MessageBody="hello")
            out.append(sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
                       ["ApproximateNumberOfMessages"])
            out.append([m["Body"] for m in sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10)["Messages"]])
            return out

    from moto import backends
    from moto.core import utils
    modules = list(backends.list_of_moto_modules())
    names = ["MessageRetentionPeriod", "DBInstanceIdentifier", "theNewAttribute", ""]
    converted = [utils.camelcase_to_underscores(n) for n in names]
    before = responses()
    sys.path.insert(0, sys.argv[1])
    import moto_server
    moto_server.tune()
    moto_server.attribute_values()
    assert list(backends.list_of_moto_modules()) == modules
    assert [utils.camelcase_to_underscores(n) for n in names] == converted
    assert responses() == before
    print(json.dumps(before, default=str))
    """
)


def test_the_tuned_server_answers_as_moto_does() -> None:
    folder = Path(slsml.local.moto_server.__file__).parent
    done = subprocess.run([sys.executable, "-P", "-c", CHECK, str(folder)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert '"hello"' in done.stdout


RANGES = textwrap.dedent(
    """
    import json, sys
    import boto3
    from botocore.exceptions import ClientError
    from moto import mock_aws

    BODY = bytes(range(256)) * (6 * 2**20 // 256 + 3)  # past moto's 5 MB in memory: kept in a temporary file
    RANGES = [None, "bytes=0-0", "bytes=1000-2999", f"bytes={len(BODY) - 10}-{len(BODY) + 50}", "bytes=-100",
              "bytes=100-", "bytes=5-2", "bytes=0-1,5-9", f"bytes={len(BODY)}-{len(BODY) + 1}"]

    def responses():
        with mock_aws():
            s3 = boto3.client("s3", region_name="us-east-1")
            s3.create_bucket(Bucket="ranges")
            s3.put_object(Bucket="ranges", Key="k", Body=BODY)
            out = []
            for byte_range in RANGES:
                try:
                    got = s3.get_object(Bucket="ranges", Key="k", **({"Range": byte_range} if byte_range else {}))
                    body = got["Body"].read()
                    out.append([byte_range, got.get("ContentRange"), len(body), body == BODY[:len(body)] or
                                BODY.find(body)])
                except ClientError as error:
                    out.append([byte_range, error.response["Error"]["Code"]])
            got = s3.get_object(Bucket="ranges", Key="k", Range="bytes=1000-2999")["Body"].read()
            assert got == BODY[1000:3000], "a ranged read returned other bytes"
            return out

    before = responses()
    sys.path.insert(0, sys.argv[1])
    import moto_server
    moto_server.ranged_reads()
    assert responses() == before, (responses(), before)
    print(json.dumps(before))
    """
)


def test_ranged_reads_answer_as_moto_does() -> None:
    folder = Path(slsml.local.moto_server.__file__).parent
    done = subprocess.run(
        [sys.executable, "-P", "-c", RANGES, str(folder)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert '"bytes 1000-2999/' in done.stdout and "InvalidRange" in done.stdout


DIRECT = textwrap.dedent(
    """
    import json, sys
    sys.path.insert(0, sys.argv[1])
    import moto_server
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.s3.models import s3_backends

    backend = s3_backends[DEFAULT_ACCOUNT_ID]["aws"]
    backend.create_bucket("direct", "us-east-1")
    backend.put_object("direct", "datasets/d/train/00000/shard.bin", bytes(range(256)) * 4)
    left = []
    serve = moto_server.direct_ranged_gets(lambda environ, start_response: left.append(environ["QUERY_STRING"]) or [])
    signed = ("X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=k%2F20261127%2Fus-east-1%2Fs3%2Faws4_request"
              "&X-Amz-Date=20261127T095543Z&X-Amz-Expires=900&X-Amz-SignedHeaders=host&X-Amz-Signature=0b6e")
    answers = {}
    queries = ("", signed, signed + "&X-Amz-Security-Token=t", signed + "&versionId=v", "AWSAccessKeyId=k&Signature=s")
    for query in queries:
        path = "/direct/datasets/d/train/00000/shard.bin"
        environ = {"REQUEST_METHOD": "GET", "RAW_URI": path + ("?" + query if query else ""), "QUERY_STRING": query,
                   "PATH_INFO": path, "HTTP_HOST": "127.0.0.1:5000", "HTTP_RANGE": "bytes=10-19"}
        body = serve(environ, lambda status, headers: answers.setdefault(query, status))
        assert query in left or b"".join(body) == bytes(range(10, 20))
    print(json.dumps({"direct": [q for q in answers if q not in left], "left": left}))
    """
)


def test_a_plain_or_pre_signed_ranged_get_is_answered_directly_and_any_other_query_left_to_moto() -> None:
    folder = Path(slsml.local.moto_server.__file__).parent
    done = subprocess.run(
        [sys.executable, "-P", "-c", DIRECT, str(folder)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    answered = json.loads(done.stdout.splitlines()[-1])
    assert len(answered["direct"]) == 3 and answered["direct"][0] == "", answered
    assert [query.rpartition("&")[2] for query in answered["left"]] == ["versionId=v", "Signature=s"]


TASK_CLIENTS = textwrap.dedent(
    """
    import json, os, sys
    os.environ["MOTO_PORT"] = "5123"
    from moto.stepfunctions.parser.asl.utils import boto_client

    from botocore.credentials import Credentials

    def described(client):
        config = client.meta.config
        return [client.meta.service_model.service_name, client.meta.region_name,
                config.parameter_validation, config.connect_timeout, config.read_timeout]

    def reaches(client):
        return [client.meta.endpoint_url, client._request_signer._credentials.access_key]

    made = [boto_client.boto_client_for(region, service) for region, service in TASKS]
    sys.path.insert(0, sys.argv[1])
    import moto_server
    moto_server.task_clients(5123, Credentials("SERVERS", "secret"))
    from moto.stepfunctions.parser.asl.component.state.exec.state_task.service import state_task_service_dynamodb
    kept = [state_task_service_dynamodb.boto_client_for(region, service) for region, service in TASKS]
    assert [described(c) for c in kept] == [described(c) for c in made]
    again = [boto_client.boto_client_for(region, service, {"RoleArn": "r"}) for region, service in TASKS]
    assert [a is k for a, k in zip(again, kept)] == [True] * len(TASKS)
    assert len({id(client) for client in kept}) == len(TASKS)
    print(json.dumps({"moto": [reaches(c) for c in made], "kept": [reaches(c) for c in kept]}))
    """
).replace("TASKS", '[("us-east-1", "dynamodb"), ("us-east-1", "sns"), ("eu-west-1", "dynamodb")]')


def test_step_functions_tasks_keep_the_client_moto_makes_per_region_and_service() -> None:
    """A state machine's tasks reuse one client per region and service, made as moto makes each task's but signing
    with the server's credentials (moto's sign with its own), at its loopback address."""
    folder = Path(slsml.local.moto_server.__file__).parent
    done = subprocess.run(
        [sys.executable, "-P", "-c", TASK_CLIENTS, str(folder)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    reached = json.loads(done.stdout)
    assert reached["moto"] == [["http://localhost:5123", "ak"]] * 3
    assert reached["kept"] == [["http://127.0.0.1:5123", "SERVERS"]] * 3


CLOSED_CONNECTION = textwrap.dedent(
    """
    import json, os, socket, sys, threading
    from botocore.credentials import Credentials

    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    os.environ["MOTO_PORT"] = str(port)
    from moto.stepfunctions.parser.asl.utils import boto_client
    answer = (
        '<PublishResponse xmlns="http://sns.amazonaws.com/doc/2010-03-31/"><PublishResult><MessageId>m-1</MessageId>'
        '</PublishResult><ResponseMetadata><RequestId>r</RequestId></ResponseMetadata></PublishResponse>'
    ).encode()
    requests = []

    def serve():  # the first request's connection is closed unanswered, as an idle one the server expires
        while True:
            connection, _ = listener.accept()
            request = connection.recv(65536)
            requests.append(request.split(b" ")[0].decode())
            if len(requests) > 1:
                connection.sendall(
                    b"HTTP/1.1 200 OK\\r\\nContent-Type: text/xml\\r\\nContent-Length: "
                    + str(len(answer)).encode() + b"\\r\\n\\r\\n" + answer
                )
            connection.close()

    threading.Thread(target=serve, daemon=True).start()
    sys.path.insert(0, sys.argv[1])
    import moto_server
    clients = {"moto": boto_client.boto_client_for("us-east-1", "sns")}
    moto_server.task_clients(port, Credentials("SERVERS", "secret"))
    clients["kept"] = boto_client.boto_client_for("us-east-1", "sns")
    answered = {}
    for name, client in clients.items():
        requests.clear()
        try:
            answered[name] = client.publish(TopicArn="arn:aws:sns:us-east-1:123456789012:t", Message="m")["MessageId"]
        except Exception as error:
            answered[name] = type(error).__name__
        answered[name + " requests"] = list(requests)
    print(json.dumps(answered))
    """
)


def test_a_step_functions_task_is_sent_again_when_the_server_closes_its_connection_unanswered() -> None:
    """A kept client's connection the server expires as a task sends on it: the task's request is sent again (moto's
    client, which tries once, fails the task, and with it the run)."""
    folder = Path(slsml.local.moto_server.__file__).parent
    done = subprocess.run(
        [sys.executable, "-P", "-c", CLOSED_CONNECTION, str(folder)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    answered = json.loads(done.stdout)
    assert answered["moto"] == "ConnectionClosedError" and answered["moto requests"] == ["POST"]
    assert answered["kept"] == "m-1" and answered["kept requests"] == ["POST", "POST"]


def _document(**statement: object) -> bytes:
    stated = {"Effect": "Deny", "Principal": "*", "Action": "s3:PutObject", "Resource": "arn:aws:s3:::b/runs/*"}
    return json.dumps({"Version": "2012-10-17", "Statement": [{**stated, **statement}]}).encode()


def test_the_deployed_policy_refuses_writes_without_if_none_match_and_nothing_else() -> None:
    statements = deployment.bucket_policy_statements("arn:aws:s3:::b")
    policy = denials(json.dumps({"Version": "2012-10-17", "Statement": statements}).encode())
    put, copy = object_request("PUT", {}, {}), object_request("PUT", {}, {"x-amz-copy-source": "b/k"})
    created = object_request("PUT", {}, {"If-None-Match": "*"})
    assert put is not None and copy is not None and created is not None
    update = f"arn:aws:s3:::b/{keys.update('r', 1, 0, attempt=1)}"
    assert denied(policy, put[0], update, put[1]) and denied(policy, copy[0], update, copy[1])
    assert not denied(policy, created[0], update, created[1])
    for key in (keys.model("r", 1), keys.final_model("r"), keys.dataset_manifest("d"), "runs/r/iters"):
        assert not denied(policy, put[0], f"arn:aws:s3:::b/{key}", put[1]), key
    assert not denied(policy, put[0], f"arn:aws:s3:::other/{keys.run_config('r')}", put[1])
    # a multipart upload: its start and parts carry no If-None-Match and create nothing (let through); its
    # completion creates the object: refused without If-None-Match
    copied_part = {"partNumber": ["1"], "uploadId": ["u"]}
    parts = [
        object_request("POST", {"uploads": [""]}, {}),
        object_request("PUT", {"partNumber": ["1"], "uploadId": ["u"]}, {}),
        object_request("PUT", copied_part, {"x-amz-copy-source": "b/k"}),
    ]
    assert all(part is not None and not denied(policy, part[0], update, part[1]) for part in parts)
    complete = object_request("POST", {"uploadId": ["u"]}, {"If-None-Match": "*"})
    assert complete is not None and not denied(policy, complete[0], update, complete[1])
    unconditioned = object_request("POST", {"uploadId": ["u"]}, {})
    assert unconditioned is not None and denied(policy, unconditioned[0], update, unconditioned[1])
    for method, query in (("GET", {}), ("DELETE", {"uploadId": ["u"]}), ("PUT", {"tagging": [""]}), ("HEAD", {})):
        assert object_request(method, query, {}) is None  # other actions, which the policy does not name


def test_the_local_policy_lets_each_function_delete_its_own_kinds_under_runs_and_nobody_else() -> None:
    """The deployed stack's deletion statements, with the local functions' principals: a function deletes what its
    wiring says it deletes, the lifecycle any object under runs/, the owner (a hand with the bucket's credentials)
    nothing there; datasets are not guarded."""
    policy = denials(json.dumps(cloud.bucket_policy("b")).encode())
    delete, version = object_request("DELETE", {}, {}), object_request("DELETE", {"versionId": ["v"]}, {})
    assert delete == ("s3:DeleteObject", {}) and version == ("s3:DeleteObjectVersion", {})
    examples = {
        keys.SCRATCH_OBJECTS: keys.update("r", 1, 0),
        keys.MODEL_OBJECTS: keys.model("r", 1),
        keys.FINAL_MODEL_OBJECTS: keys.final_model("r"),
        keys.RUN_CONFIG_OBJECTS: keys.run_config("r"),
    }
    for kind, key in examples.items():
        for action in ("s3:DeleteObject", "s3:DeleteObjectVersion"):
            refused = {
                name
                for name in [fn.name for fn in wiring.FUNCTIONS] + [cloud.LIFECYCLE]
                if denied(policy, action, f"arn:aws:s3:::b/{key}", {PRINCIPAL_ARN: cloud.role_arn(name)})
            }
            deleting = {fn.name for fn in wiring.FUNCTIONS if kind in fn.deletes}
            assert refused == {fn.name for fn in wiring.FUNCTIONS} - deleting, (kind, action)
            assert denied(policy, action, f"arn:aws:s3:::b/{key}", {PRINCIPAL_ARN: cloud.OWNER_ARN}), key
            assert denied(policy, action, f"arn:aws:s3:::b/{key}", {}), key  # no principal known: refused too
    dataset = f"arn:aws:s3:::b/{keys.dataset_manifest('d')}"
    assert not denied(policy, "s3:DeleteObject", dataset, {PRINCIPAL_ARN: cloud.OWNER_ARN})


def test_object_requests_carry_whether_they_create_the_object() -> None:
    creating = {
        ("PUT", ()): "true",  # PutObject
        ("PUT", ("x-amz-copy-source",)): "true",  # CopyObject
        ("POST", ("uploadId",)): "true",  # CompleteMultipartUpload
        ("POST", ("uploads",)): "false",  # CreateMultipartUpload
        ("PUT", ("partNumber", "uploadId")): "false",  # UploadPart
        ("PUT", ("partNumber", "uploadId", "x-amz-copy-source")): "false",  # UploadPartCopy
    }
    for (method, named), expected in creating.items():
        query = {name: ["1"] for name in named if name != "x-amz-copy-source"}
        headers = {"x-amz-copy-source": "b/k"} if "x-amz-copy-source" in named else {}
        found = object_request(method, query, headers)
        assert found is not None and found[1]["s3:objectcreationoperation"] == expected, (method, named)


def test_a_bool_condition_matches_its_value_and_not_a_missing_key() -> None:
    creates = denials(_document(Condition={"Bool": {"s3:ObjectCreationOperation": "True"}}))
    assert denied(creates, "s3:PutObject", "arn:aws:s3:::b/runs/k", {"s3:objectcreationoperation": "true"})
    assert not denied(creates, "s3:PutObject", "arn:aws:s3:::b/runs/k", {"s3:objectcreationoperation": "false"})
    assert not denied(creates, "s3:PutObject", "arn:aws:s3:::b/runs/k", {})
    parts = denials(_document(Condition={"Bool": {"s3:ObjectCreationOperation": False}}))
    assert denied(parts, "s3:PutObject", "arn:aws:s3:::b/runs/k", {"s3:objectcreationoperation": "false"})
    assert not denied(parts, "s3:PutObject", "arn:aws:s3:::b/runs/k", {"s3:objectcreationoperation": "true"})


def test_a_null_condition_matches_the_presence_it_names() -> None:
    present = denials(_document(Condition={"Null": {"s3:if-none-match": "false"}}))
    assert denied(present, "s3:PutObject", "arn:aws:s3:::b/runs/k", {"s3:if-none-match": "*"})
    assert not denied(present, "s3:PutObject", "arn:aws:s3:::b/runs/k", {})
    unconditioned = denials(_document(Resource=["arn:aws:s3:::b/runs/?/x", "arn:aws:s3:::b/data/*"]))
    assert denied(unconditioned, "s3:PutObject", "arn:aws:s3:::b/runs/a/x", {"s3:if-none-match": "*"})
    assert not denied(unconditioned, "s3:PutObject", "arn:aws:s3:::b/runs/ab/x", {})
    assert denials(_document(Effect="Allow", Action="s3:*", Principal={"AWS": "arn:aws:iam::1:root"})) == ()


@pytest.mark.parametrize(
    ("statement", "named"),
    [
        ({"Action": "s3:*"}, "s3:*"),
        ({"Action": ["s3:PutObject", "s3:GetObject"]}, "['s3:GetObject']"),
        ({"Principal": {"AWS": "arn:aws:iam::1:root"}}, "arn:aws:iam::1:root"),
        ({"NotResource": "arn:aws:s3:::b/x"}, "NotResource"),
        ({"Condition": {"StringEquals": {"s3:if-none-match": "*"}}}, "StringEquals"),
        ({"Condition": {"Null": {"s3:if-match": "true"}}}, "s3:if-match"),
        ({"Condition": {"Null": {"s3:if-none-match": "yes"}}}, "yes"),
        ({"Condition": {"Bool": {"s3:ObjectCreationOperation": "1"}}}, "'1'"),
        ({"Condition": {"Bool": {"aws:SecureTransport": "true"}}}, "aws:SecureTransport"),
        ({"Condition": {"Null": {"s3:ObjectCreationOperation": "true"}}}, "s3:ObjectCreationOperation"),
        ({"Condition": {"ArnLike": {"aws:PrincipalArn": "arn:aws:iam::1:root"}}}, "ArnLike"),
        ({"Condition": {"StringNotEquals": {"kms:EncryptionContext:run": "r"}}}, "kms:EncryptionContext:run"),
        ({"Condition": {"ArnNotEquals": {"aws:SourceArn": "arn:aws:iam::1:root"}}}, "aws:SourceArn"),
    ],
)
def test_a_policy_the_server_does_not_evaluate_is_refused_by_name(statement: dict, named: str) -> None:
    with pytest.raises(ValueError, match=re.escape(named)):
        denials(_document(**statement))


def test_the_signing_keys_policy_lets_each_role_unseal_its_own_kind_alone() -> None:
    """Evaluated as the local cloud enforces it: each role's Decrypt is denied unless the encryption context names its
    own kind (a role that signs nothing: always); key pairs are made by the launching role alone; nobody re-encrypts."""
    policy = denials(json.dumps(cloud.key_policy()).encode())
    key = "arn:aws:kms:us-east-1:123456789012:key/k"
    unsealed = {
        (fn.name, kind)
        for fn in wiring.FUNCTIONS
        for kind in (*wiring.SIGNERS, "other")
        if not denied(
            policy, "kms:Decrypt", key, {PRINCIPAL_ARN: cloud.role_arn(fn.name), "kms:encryptioncontext:kind": kind}
        )
    }
    assert unsealed == {(kind, kind) for kind in wiring.SIGNERS}
    makers = [
        fn.name for fn in wiring.FUNCTIONS if not denied(policy, MAKE, key, {PRINCIPAL_ARN: cloud.role_arn(fn.name)})
    ]
    assert makers == ["work_launcher"]
    assert all(
        denied(policy, "kms:ReEncryptFrom", key, {PRINCIPAL_ARN: cloud.role_arn(fn.name)}) for fn in wiring.FUNCTIONS
    )
    owner = {PRINCIPAL_ARN: cloud.OWNER_ARN, "kms:encryptioncontext:kind": "merger"}
    assert not denied(policy, "kms:Decrypt", key, owner) and not denied(policy, MAKE, key, owner)


MAKE = "kms:GenerateDataKeyPairWithoutPlaintext"
CREDENTIALS = Credentials("SLSMLKEY", "the-secret")
KNOWN = {CREDENTIALS.access_key: CREDENTIALS, "OTHERKEY": Credentials("OTHERKEY", "another-secret")}
NOW = 1_800_000_000.0


def _environ(request: AWSRequest) -> dict[str, Any]:
    """The WSGI environ cheroot gives the server for ``request``, as sent."""
    url = urllib.parse.urlsplit(request.url)
    environ: dict[str, Any] = {
        "REQUEST_METHOD": request.method,
        "REQUEST_URI": url.path + (f"?{url.query}" if url.query else ""),
        "PATH_INFO": url.path,
        "QUERY_STRING": url.query,
        "HTTP_HOST": url.netloc,
    }
    for name, value in request.headers.items():
        key = name.upper().replace("-", "_")
        environ[key if key in ("CONTENT_TYPE", "CONTENT_LENGTH") else f"HTTP_{key}"] = value
    return environ


def _signed(signer: Any, method: str, url: str, body: bytes = b"", **headers: str) -> AWSRequest:
    request = AWSRequest(method=method, url=url, data=body, headers=headers)
    with mock.patch("botocore.auth.get_current_datetime", return_value=dt.datetime.fromtimestamp(NOW, dt.UTC)):
        signer.add_auth(request)
    return request


def _refused(
    environ: dict[str, Any], body: bytes = b"", now: float = NOW, credentials: Credentials = CREDENTIALS
) -> str:
    with pytest.raises(Refused) as refused:
        verify(environ, {credentials.access_key: credentials}, now, lambda: body)
    return refused.value.s3_code


def test_a_request_botocore_signed_with_the_credentials_is_verified_and_any_change_refused() -> None:
    url = "http://127.0.0.1:5000/bucket/runs/r/iters/000001/w.npz?partNumber=1"
    s3 = _environ(_signed(S3SigV4Auth(CREDENTIALS, "s3", "us-east-1"), "GET", url, Range="bytes=0-9"))
    assert verify(s3, KNOWN, NOW).service == "s3"
    body = b'{"TableName": "runs"}'
    table = _signed(SigV4Auth(CREDENTIALS, "dynamodb", "us-east-1"), "POST", "http://127.0.0.1:5000/", body)
    assert verify(_environ(table), KNOWN, NOW + 60, lambda: body).service == "dynamodb"
    assert _refused(_environ(table), b'{"TableName": "other"}') == "SignatureDoesNotMatch"  # its body changed
    assert _refused(s3 | {"HTTP_RANGE": "bytes=0-99"}) == "SignatureDoesNotMatch"  # a signed header changed
    assert _refused(s3 | {"REQUEST_URI": s3["REQUEST_URI"].replace("000001", "000002")}) == "SignatureDoesNotMatch"
    assert _refused(s3, credentials=Credentials("SLSMLKEY", "another")) == "SignatureDoesNotMatch"
    assert _refused(s3, credentials=Credentials("OTHERKEY", "the-secret")) == "InvalidAccessKeyId"
    assert _refused(s3 | {"HTTP_AUTHORIZATION": s3["HTTP_AUTHORIZATION"].replace("SLSMLKEY", "OTHERKEY")}) == (
        "InvalidAccessKeyId"  # another's key, unknown to this server
    )
    with pytest.raises(Refused, match="does not match"):  # another known key: its secret did not sign it
        verify(s3 | {"HTTP_AUTHORIZATION": s3["HTTP_AUTHORIZATION"].replace("SLSMLKEY", "OTHERKEY")}, KNOWN, NOW)
    assert _refused(s3, now=NOW + MAX_SKEW_S + 1) == "RequestTimeTooSkewed"
    assert _refused({k: v for k, v in s3.items() if k != "HTTP_AUTHORIZATION"}) == "AccessDenied"  # unsigned
    assert _refused(s3 | {"HTTP_AUTHORIZATION": "AWS SLSMLKEY:c2lnbmVk"}) == "AccessDenied"  # SigV2


def test_a_pre_signed_url_is_verified_until_it_expires() -> None:
    signer = S3SigV4QueryAuth(CREDENTIALS, "s3", "us-east-1", expires=60)
    presigned = _environ(_signed(signer, "GET", "http://127.0.0.1:5000/bucket/datasets/d/shard-0.npz"))
    assert verify(presigned, KNOWN, NOW + 59).expires_s == 60
    assert _refused(presigned, now=NOW + 61) == "AccessDenied"
    other = presigned["REQUEST_URI"].replace("shard-0", "shard-1")
    assert _refused(presigned | {"REQUEST_URI": other}) == "SignatureDoesNotMatch"


def test_the_signing_key_is_derived_once_per_day_region_and_service() -> None:
    signing_key.cache_clear()
    s3 = _environ(_signed(S3SigV4Auth(CREDENTIALS, "s3", "us-east-1"), "GET", "http://127.0.0.1:5000/bucket"))
    for _ in range(3):
        verify(s3, KNOWN, NOW)
    assert (signing_key.cache_info().misses, signing_key.cache_info().hits) == (1, 2)


def test_an_s3_request_s_body_must_be_the_payload_it_was_signed_for() -> None:
    """S3 signs the SHA-256 of a PUT's body (X-Amz-Content-SHA256), not the body: a captured PUT replayed with another
    body, its signature and headers as sent, is refused; an unsigned payload is taken as S3 takes it."""
    url = "http://127.0.0.1:5000/bucket/runs/r/run.json"
    put = _environ(_signed(S3SigV4Auth(CREDENTIALS, "s3", "us-east-1"), "PUT", url, b'{"lr": 0.003}'))
    assert verify(put, KNOWN, NOW, lambda: b'{"lr": 0.003}').service == "s3"
    assert _refused(put, b'{"lr": 0.3}') == "XAmzContentSHA256Mismatch"
    assert _refused(put, b"") == "XAmzContentSHA256Mismatch"
    unsigned = AWSRequest(method="PUT", url=url.replace("http", "https"), data=b"x")
    unsigned.context["client_config"] = Config(s3={"payload_signing_enabled": False})  # as a client may choose
    with mock.patch("botocore.auth.get_current_datetime", return_value=dt.datetime.fromtimestamp(NOW, dt.UTC)):
        S3SigV4Auth(CREDENTIALS, "s3", "us-east-1").add_auth(unsigned)
    assert unsigned.headers["X-Amz-Content-SHA256"] == "UNSIGNED-PAYLOAD"
    assert verify(_environ(unsigned), KNOWN, NOW, lambda: b"anything").service == "s3"
