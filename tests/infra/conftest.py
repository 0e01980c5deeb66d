"""One synthesis of the slsml stack per test session (layer build skipped), with cdk.json's context (create_app reads
it, as app.py does); and one with a GPU worker."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
# The CDK app's own import roots (app.py does the same for shared/).
for path in (str(ROOT), str(ROOT / "shared")):
    if path not in sys.path:
        sys.path.insert(0, path)

from aws_cdk.assertions import Template  # noqa: E402

from infra import create_app  # noqa: E402
from infra.stack import SlsmlStack  # noqa: E402


@dataclass(frozen=True)
class Synthesized:
    stack: SlsmlStack
    outdir: Path
    template: Template

    @property
    def resources(self) -> dict[str, dict[str, Any]]:
        return self.template.to_json()["Resources"]

    def logical_id(self, construct: Any) -> str:
        """The template id of an L2 construct's main resource."""
        return self.stack.get_logical_id(construct.node.default_child)


@pytest.fixture(scope="session")
def cdk_context() -> dict[str, Any]:
    """What the tests give the app over cdk.json's context, as ``cdk synth -c`` would."""
    return {"skip_layer_build": True}


# a GPU worker: the context key that turns it on, and nothing else (its fleet's other settings are defaults)
GPU_CONTEXT = {"functions": {"worker": {"accelerator_gib": 24}}}


def synthesize(context: dict[str, Any], outdir: Path) -> Synthesized:
    app, stack = create_app(context, outdir=str(outdir))
    assembly = app.synth()
    template = Template.from_json(assembly.get_stack_by_name(stack.stack_name).template)
    return Synthesized(stack=stack, outdir=outdir, template=template)


@pytest.fixture(scope="session")
def synthesized(cdk_context: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Synthesized:
    return synthesize(cdk_context, tmp_path_factory.mktemp("cdk.out"))


@pytest.fixture(scope="session")
def gpu_synthesized(cdk_context: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Synthesized:
    """The stack with a GPU worker (``functions.worker.accelerator_gib=24``) on Lambda Managed Instances."""
    return synthesize(cdk_context | GPU_CONTEXT, tmp_path_factory.mktemp("cdk.out.gpu"))
