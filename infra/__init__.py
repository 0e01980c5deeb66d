"""The CDK app of slsml: one stack (infra.stack) composed of one construct per concern."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from aws_cdk import App, Aspects
from cdk_nag import AwsSolutionsChecks

from infra.settings import Settings
from infra.stack import SlsmlStack

CDK_JSON = Path(__file__).resolve().parents[1] / "cdk.json"


def project_context() -> dict[str, Any]:
    """cdk.json's ``context``: the deployment's settings and the feature flags the stack is written for."""
    context: dict[str, Any] = json.loads(CDK_JSON.read_text())["context"]
    return context


def create_app(context: Mapping[str, Any] | None = None, outdir: str | None = None) -> tuple[App, SlsmlStack]:
    """The app with its stack, checked by cdk-nag's AwsSolutions pack on every synth.

    Its context is cdk.json's, under ``context``, under what the cdk CLI passes (``-c``, read from the environment
    by App): so ``python app.py`` synthesizes what ``cdk synth`` does, feature flags included."""
    app = App(context=project_context() | dict(context or {}), outdir=outdir)
    settings = Settings.from_context(app.node)
    stack = SlsmlStack(app, settings.stack_name, settings=settings)
    Aspects.of(app).add(AwsSolutionsChecks(verbose=True))
    return app, stack
