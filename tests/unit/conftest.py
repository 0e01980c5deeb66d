"""Unit tests: pure modules, no network. TensorFlow is imported at most once per session (by keras)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import boto3
import pytest
from moto import mock_aws
from moto.core.config import default_user_config

from slsml.accounting import usage
from slsml.aws.storage import ObjectStore
from slsml.local import moto_server

from . import cloud

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")
# moto's mock intercepts every session's clients: keeping boto3's default session keeps its parsed service
# descriptions (several MB of JSON) from test to test, where a new session per mock reads them again
default_user_config["core"]["reset_boto3_session"] = False
moto_server.kms_key_pairs()  # the local cloud's KMS key pairs, which moto lacks


@pytest.fixture(autouse=True)
def _no_endpoint(monkeypatch: pytest.MonkeyPatch) -> None:
    """moto's in-process mock, never a server an earlier test pointed AWS_ENDPOINT_URL at."""
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)


@pytest.fixture(autouse=True)
def _no_earlier_requests(monkeypatch: pytest.MonkeyPatch) -> None:
    """Requests that earlier tests in this process made outside a handler are not the next handler's."""
    monkeypatch.setattr(usage, "_pending", usage._Counts())


@pytest.fixture
def services(monkeypatch: pytest.MonkeyPatch):
    """A bucket, run table and topics in moto, holding dataset ``d`` (``cloud.moto_services``)."""
    with cloud.moto_services(monkeypatch) as services:
        yield services


@pytest.fixture
def store(monkeypatch: pytest.MonkeyPatch) -> Iterator[ObjectStore]:
    """An empty S3 bucket, ``bucket``, in moto."""
    for name in ("AWS_ENDPOINT_URL_S3", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    with mock_aws():
        s3 = boto3.client("s3", region_name="us-east-1")
        s3.create_bucket(Bucket="bucket")
        yield ObjectStore(s3, "bucket")


@pytest.fixture(scope="module")
def model_bytes() -> bytes:
    """A small compiled Keras model (6 features, 3 classes), saved: the worker tests' (a module may give its own)."""
    import keras

    from slsml.training import modelio

    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [keras.Input((6,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(3, activation="softmax")]
    )
    model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
    return modelio.save_model(model)
