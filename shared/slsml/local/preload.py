"""The libraries every warm function process imports, imported once: the function host forks its processes
from a server process that imported this module (``multiprocessing``'s forkserver), so a process starts in
well under a second, not in the seconds TensorFlow takes to import, and shares those pages with its
siblings. boto3's default session, which ``slsml.aws.clients`` makes its clients from, has read the service
descriptions of what the functions call already. Of slsml's own modules, only the pure definitions of its
messages, records and settings are imported here (pydantic builds their classes, a tenth of a second); the
others are left to each process, as on Lambda: their loggers and settings read the function's environment
when they are imported; where Python writes no bytecode (``PYTHONDONTWRITEBYTECODE``, ``-B``), their sources are
compiled here once (``slsml.local.compiled``), not again by each process. What the libraries take, before TensorFlow
and with it, is measured as they are imported (``LIBRARIES_BYTES``, ``TENSORFLOW_BYTES``): what a container holds
once it imported them, by which a forked process counts its memory (``slsml.local.memory``)."""

import gc
import os
import signal
import sys
from pathlib import Path

# Ctrl-C in a terminal reaches the whole foreground group. The command that started these processes handles it,
# and they end with it (``slsml.local.host``): neither this fork server, while it imports, nor the processes it
# forks (which inherit its handler) take it.
signal.signal(signal.SIGINT, signal.SIG_IGN)

from slsml.training import quiet  # noqa: E402

os.environ.setdefault("OMP_NUM_THREADS", "1")  # numpy's BLAS threads, read once at its import: one per process
quiet.install()

import aws_lambda_powertools.utilities.idempotency  # noqa: E402
import aws_lambda_powertools.utilities.parser  # noqa: E402
import aws_lambda_powertools.utilities.parser.envelopes  # noqa: E402
import aws_lambda_powertools.utilities.parser.models  # noqa: E402,F401
import aws_xray_sdk.core  # noqa: E402,F401
import boto3  # noqa: E402
import cryptography.hazmat.primitives.asymmetric.ec  # noqa: E402
import cryptography.hazmat.primitives.serialization  # noqa: E402,F401
import numpy  # noqa: E402,F401
import pydantic_settings  # noqa: E402,F401

# with slsml.spec.config and slsml.spec.messages: classes, nothing read from the environment
import slsml.state.records  # noqa: E402,F401
from slsml.local import compiled, memory  # noqa: E402

# the session reads a service's descriptions when it makes its first client; these clients are thrown away (a
# function's own read the region, credentials and endpoint of its environment)
boto3.setup_default_session()
_anywhere = {
    "region_name": "us-east-1",
    "endpoint_url": "http://127.0.0.1",
    "aws_access_key_id": "preload",
    "aws_secret_access_key": "preload",
}
for service in ("s3", "dynamodb", "sns", "sqs", "stepfunctions"):
    boto3.DEFAULT_SESSION.client(service, **_anywhere)
boto3.DEFAULT_SESSION.resource("dynamodb", **_anywhere)

# what a container holds once it imported its function's libraries, as Lambda counts it (slsml.local.memory): a zip
# function's, then a TensorFlow function's
LIBRARIES_BYTES = memory.resident_bytes() or 0

import keras  # noqa: E402,F401
import tensorflow  # noqa: E402,F401

TENSORFLOW_BYTES = memory.resident_bytes() or 0

if sys.dont_write_bytecode:  # no bytecode files to load slsml's modules from: the processes take the code compiled here
    sys.meta_path.insert(0, compiled.PrecompiledSources(Path(memory.__file__).parents[1]))

gc.freeze()  # the collector leaves these objects alone, so the forked processes do not copy their pages
