"""Deployment settings come from CDK context, over per-function defaults."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from aws_cdk import App
from aws_cdk.assertions import Annotations, Match, Template
from pydantic import ValidationError

from infra import create_app
from infra.settings import DEFAULT_FUNCTIONS, Settings
from slsml.spec import wiring
from slsml.spec.limits import RunLimits


def test_defaults_size_every_pipeline_function() -> None:
    settings = Settings.from_context(App().node)
    assert settings.stack_name == "Slsml"
    assert set(settings.functions) == {fn.name for fn in wiring.FUNCTIONS}
    assert settings.functions["worker"] == DEFAULT_FUNCTIONS["worker"]


def test_context_overrides_merge_over_the_function_defaults() -> None:
    context = {
        "stack_name": "SlsmlDev",
        "removal_policy": "destroy",
        "skip_layer_build": "true",  # `cdk -c key=value` passes strings
        "functions": '{"worker": {"memory_mb": 4096, "reserved_concurrency": 50}}',
    }
    settings = Settings.from_context(App(context=context).node)
    assert (settings.stack_name, settings.removal_policy, settings.skip_layer_build) == ("SlsmlDev", "destroy", True)
    worker = settings.functions["worker"]
    assert (worker.memory_mb, worker.reserved_concurrency) == (4096, 50)
    assert worker.timeout_s == DEFAULT_FUNCTIONS["worker"].timeout_s
    assert settings.functions["reducer"] == DEFAULT_FUNCTIONS["reducer"]


@pytest.mark.parametrize(
    "context",
    [
        {"functions": {"trainer": {"memory_mb": 1024}}},
        {"functions": {"worker": {"memory_mb": 64}}},
        {"stack_name": "1x"},
        {"scratch_expiry_days": 2},  # updates are read for up to 2 days: they must outlive that
        {"run_limits": {"workers": 0}},
        {"run_limits": '{"gpus": 4}'},
        # the fleet's reservations would leave less than AWS's unreserved minimum of the account's concurrency
        {"functions": {"worker": {"reserved_concurrency": 900}}},
        {"account_concurrency": 500},
        {"run_limits": {"function_timeouts_s": {"worker": 30}}},  # a deployment's timeouts are its functions'
        {"run_limits": {"worker_memory_mb": 10240}},  # and its worker's memory is the function's
    ],
)
def test_invalid_settings_are_rejected(context: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        Settings.from_context(App(context=context).node)


def test_run_limits_and_reservations_come_from_context() -> None:
    context = {
        "run_limits": '{"workers": 32, "iterations": 500}',  # `cdk -c run_limits=...` passes a string
        "functions": '{"worker": {"reserved_concurrency": null, "memory_mb": 6144}}',
        "account_concurrency": 3000,
    }
    settings = Settings.from_context(App(context=context).node)
    assert (settings.run_limits.workers, settings.run_limits.iterations) == (32, 500)
    assert settings.limits.worker_memory_mb == 6144  # what a run's micro-batches are sized to at its start
    assert settings.run_limits.reducers == RunLimits().reducers
    assert settings.functions["worker"].reserved_concurrency is None  # none reserved: the account's pool
    assert settings.functions["reducer"].reserved_concurrency == DEFAULT_FUNCTIONS["reducer"].reserved_concurrency


def test_a_disposable_deployment_synthesizes_cleanly(cdk_context: dict[str, Any], tmp_path: Path) -> None:
    context = cdk_context | {"stack_name": "SlsmlDev", "removal_policy": "destroy", "bucket_versioning": True}
    app, stack = create_app(context, outdir=str(tmp_path))
    template = Template.from_json(app.synth().get_stack_by_name("SlsmlDev").template)
    assert Annotations.from_stack(stack).find_error("*", Match.string_like_regexp("AwsSolutions-.*")) == []
    template.all_resources("AWS::S3::Bucket", {"DeletionPolicy": "Delete"})
    template.all_resources("AWS::DynamoDB::Table", {"DeletionPolicy": "Delete"})
    template.resource_count_is("Custom::S3AutoDeleteObjects", 2)
    scratch = Match.object_like({"Id": "ExpireIterationScratch", "NoncurrentVersionExpiration": Match.any_value()})
    template.has_resource_properties(
        "AWS::S3::Bucket",
        {
            "VersioningConfiguration": {"Status": "Enabled"},
            "LifecycleConfiguration": {"Rules": Match.array_with([scratch])},
        },
    )


def test_a_worker_timeout_beyond_the_runs_default_deadline_needs_a_default_deadline_to_match() -> None:
    longer = {"functions": {"worker": {"timeout_s": 600}}}
    with pytest.raises(ValidationError, match=r"run_defaults: a deadline of 120 s .* worker function's 600 s timeout"):
        Settings.from_context(App(context=longer).node)
    matched = longer | {"run_defaults": {"training": {"deadline_s": 600}}}
    settings = Settings.from_context(App(context=matched).node)
    assert settings.limits.function_timeouts_s["worker"] == 600
    assert settings.limits.deadline_refusal(599) and not settings.limits.deadline_refusal(600)
