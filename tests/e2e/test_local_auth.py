"""`slsml local up`'s cloud is its user's alone. Another user of the machine (here: nobody, with a real HTTP client)
is refused listing its bucket, reading its state through moto's management endpoints and dropping a model into
incoming/, and cannot read its state folder, where its credentials are; a request signed with other credentials is
refused; `local env`'s credentials sign for any AWS client (boto3, the AWS CLI, curl's SigV4). The service lives in a
folder others may enter, as a project folder is: its state folder alone keeps them out."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError

from slsml.local import service as service_module

from .service import local_service, service_env, service_store, slsml

AWS_CLI = os.environ.get("SLSML_AWS_CLI", str(Path(__file__).parents[2] / ".venv-awscli" / "bin" / "aws"))
ANOTHER_USER = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"]
REPOSITORY = Path(__file__).parents[2]


@pytest.fixture(scope="module")
def home() -> Iterator[Path]:
    """A folder every user may enter and read (0755), with `slsml local up` running in it."""
    folder = Path(tempfile.mkdtemp(prefix="slsml-auth-"))
    try:
        folder.chmod(0o755)
        with local_service(folder) as state:
            assert "secret_access_key" not in state["deployment"]  # `local up --json` leaves it to `local env`
            yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _as_another_user(*command: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*ANOTHER_USER, *command],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=cwd,
        env={
            "PATH": os.environ["PATH"],
            "HOME": "/tmp",
            "PYTHONPATH": str(REPOSITORY / "shared"),
            # pointed at this user's state directory: they are told it is not theirs
            service_module.STATE_HOME_ENV: os.environ[service_module.STATE_HOME_ENV],
        },
    )


def _curl(*arguments: str) -> tuple[int, str]:
    """The status and body of a request another user sends with curl."""
    done = _as_another_user("curl", "-s", "-w", "\n%{http_code}", *arguments)
    assert done.returncode == 0, done.stderr
    body, _, status = done.stdout.rpartition("\n")
    return int(status), body


def test_the_state_folder_and_its_files_are_the_users_alone(home: Path) -> None:
    state_dir = service_module.user_state_dir()
    assert state_dir.is_relative_to(home)  # the state directory `local_service` named for the module
    modes = {path.name: stat.S_IMODE(path.stat().st_mode) for path in [state_dir, *state_dir.iterdir()]}
    assert modes == {"local": 0o700, "service.json": 0o600, "service.log": 0o600, "logs": 0o700}, modes
    assert all(
        stat.S_IMODE(log.stat().st_mode) & 0o077 == 0 for log in (state_dir / "logs").iterdir()
    )  # made under the service's umask
    assert _as_another_user("ls", str(home)).returncode == 0  # the folder around it is open to them
    for command in (["ls", str(state_dir)], ["cat", str(state_dir / service_module.STATE_FILE)]):
        refused = _as_another_user(*command)
        assert refused.returncode != 0 and "Permission denied" in refused.stderr, refused


def test_another_user_is_refused_listing_state_and_puts(home: Path) -> None:
    env = service_env(home)
    endpoint, bucket = env["AWS_ENDPOINT_URL"], env["SLSML_BUCKET"]
    store = service_store(home)
    store.put_new("incoming/kept.json", b"{}")
    attempts = [
        ("GET", f"{endpoint}/{bucket}?list-type=2", [], "<Code>AccessDenied</Code>"),
        ("GET", f"{endpoint}/moto-api/data.json", [], '"__type": "MissingAuthenticationTokenException"'),
        ("POST", f"{endpoint}/moto-api/reset", [], '"__type": "MissingAuthenticationTokenException"'),
        ("PUT", f"{endpoint}/{bucket}/incoming/dropped.keras", ["--data-binary", "model"], "AccessDenied"),
        # signed with credentials it might guess (a local cloud's usual ones), by curl's own SigV4
        (
            "GET",
            f"{endpoint}/{bucket}?list-type=2",
            ["--aws-sigv4", "aws:amz:us-east-1:s3", "--user", "test:test"],
            "<Code>InvalidAccessKeyId</Code>",
        ),
        (
            "PUT",
            f"{endpoint}/{bucket}/incoming/dropped.keras",
            ["--aws-sigv4", "aws:amz:us-east-1:s3", "--user", f"{env['AWS_ACCESS_KEY_ID']}:guessed"],
            "<Code>SignatureDoesNotMatch</Code>",
        ),
    ]
    for method, url, options, error in attempts:
        status, body = _curl("-X", method, *options, url)
        assert (status, error in body) == (403, True), (method, url, status, body)
        assert "incoming/kept.json" not in body
    assert store.list_keys("incoming/") == ["incoming/kept.json"]  # nothing was dropped, nothing reset
    # the same client, signing with `local env`'s credentials, is answered: what it lacked was them alone
    signing = [
        "--aws-sigv4",
        "aws:amz:us-east-1:s3",
        "--user",
        f"{env['AWS_ACCESS_KEY_ID']}:{env['AWS_SECRET_ACCESS_KEY']}",
    ]
    status, body = _curl("-X", "GET", *signing, f"{endpoint}/{bucket}?list-type=2")
    assert status == 200 and "incoming/kept.json" in body, body


def test_another_user_is_told_the_service_is_not_theirs(home: Path) -> None:
    for action in ("env", "status"):
        refused = _as_another_user(sys.executable, "-m", "slsml.cli.main", "local", action, cwd=home)
        assert refused.returncode != 0
        assert "another user's local service" in refused.stderr and "Traceback" not in refused.stderr, refused.stderr
        assert "AWS_SECRET_ACCESS_KEY" not in refused.stdout


def test_aws_clients_sign_with_local_envs_credentials_and_no_others(home: Path) -> None:
    env = service_env(home)
    assert env["AWS_SECRET_ACCESS_KEY"] not in slsml(home, "local", "status", "--json").stdout
    bucket = env["SLSML_BUCKET"]
    aws = {**{k: v for k, v in os.environ.items() if not k.startswith("AWS_")}, **env}
    listed = subprocess.run(
        [AWS_CLI, "s3api", "list-objects-v2", "--bucket", bucket], capture_output=True, text=True, env=aws, timeout=120
    )
    assert listed.returncode == 0, listed.stderr
    wrong = aws | {"AWS_SECRET_ACCESS_KEY": "guessed"}
    refused = subprocess.run(
        [AWS_CLI, "s3api", "list-objects-v2", "--bucket", bucket],
        capture_output=True,
        text=True,
        env=wrong,
        timeout=120,
    )
    assert refused.returncode != 0 and "SignatureDoesNotMatch" in refused.stderr, refused.stderr
    dynamodb = boto3.client(
        "dynamodb",
        endpoint_url=env["AWS_ENDPOINT_URL"],
        region_name=env["AWS_REGION"],
        aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key="guessed",
        config=Config(retries={"total_max_attempts": 1}),
    )
    with pytest.raises(ClientError) as raised:
        dynamodb.scan(TableName=env["SLSML_TABLE"])
    assert raised.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403
    assert raised.value.response["Error"]["Code"] == "InvalidSignatureException"
    assert json.loads(slsml(home, "local", "env", "--json").stdout) == env
