"""Unit tests: pure modules, no network. TensorFlow is imported at most once per session (by keras)."""

from __future__ import annotations

import os

import pytest
from moto.core.config import default_user_config

from slsml.accounting import usage

from . import cloud

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")
# moto's mock intercepts every session's clients: keeping boto3's default session keeps its parsed service
# descriptions (several MB of JSON) from test to test, where a new session per mock reads them again
default_user_config["core"]["reset_boto3_session"] = False


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
