"""One synthesis of the slsml stack per test session (layer build skipped), with cdk.json's context."""

from __future__ import annotations

import json
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
    return json.loads((ROOT / "cdk.json").read_text())["context"] | {"skip_layer_build": True}


@pytest.fixture(scope="session")
def synthesized(cdk_context: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Synthesized:
    outdir = tmp_path_factory.mktemp("cdk.out")
    app, stack = create_app(cdk_context, outdir=str(outdir))
    assembly = app.synth()
    template = Template.from_json(assembly.get_stack_by_name(stack.stack_name).template)
    return Synthesized(stack=stack, outdir=outdir, template=template)
