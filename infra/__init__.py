"""The CDK app of slsml: one stack (infra.stack) composed of one construct per concern."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from aws_cdk import App, Aspects
from cdk_nag import AwsSolutionsChecks

from infra.settings import Settings
from infra.stack import SlsmlStack


def create_app(context: Mapping[str, Any] | None = None, outdir: str | None = None) -> tuple[App, SlsmlStack]:
    """The app with its stack, checked by cdk-nag's AwsSolutions pack on every synth."""
    app = App(context=dict(context) if context else None, outdir=outdir)
    settings = Settings.from_context(app.node)
    stack = SlsmlStack(app, settings.stack_name, settings=settings)
    Aspects.of(app).add(AwsSolutionsChecks(verbose=True))
    return app, stack
