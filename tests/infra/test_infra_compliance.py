"""cdk-nag (AwsSolutions) and cfn-lint pass on the synthesized stack, with a CPU worker and with a GPU worker, and
every nag suppression says why. cfn-lint runs as it does from the repository root: with .cfnlintrc, whose schema patch
(cfn-lint/) adds the AcceleratorConfig of a GPU worker that cfn-lint's own schemas lack; it lints the template that
``make synth`` writes (app.py, with cdk.json's feature flags) and finds neither error nor warning."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from aws_cdk.assertions import Annotations, Match

from infra.layers import ROOT
from tests.infra.conftest import GPU_CONTEXT

if TYPE_CHECKING:
    from conftest import Synthesized

NAG_FINDING = Match.string_like_regexp("AwsSolutions-.*")
CFN_LINT = [sys.executable, "-c", "from cfnlint.runner import main; main()"]


@pytest.fixture(params=["cpu", "gpu"])
def stack(request: pytest.FixtureRequest) -> Synthesized:
    """Each deployment the compliance checks hold for: a CPU worker (the default), a GPU worker."""
    fixture = {"cpu": "synthesized", "gpu": "gpu_synthesized"}[request.param]
    synthesized: Synthesized = request.getfixturevalue(fixture)
    return synthesized


def cfn_lint(*arguments: Path | str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    """cfn-lint on templates (and options) as run from ``cwd`` (from the repository root: with .cfnlintrc)."""
    return subprocess.run([*CFN_LINT, *map(str, arguments)], cwd=cwd, capture_output=True, text=True, check=False)


def test_cdk_nag_reports_no_unsuppressed_finding(stack: Synthesized) -> None:
    annotations = Annotations.from_stack(stack.stack)
    assert annotations.find_error("*", NAG_FINDING) == []
    assert annotations.find_warning("*", NAG_FINDING) == []


def test_cdk_nag_report_is_compliant_or_suppressed_with_a_reason(stack: Synthesized) -> None:
    (report,) = stack.outdir.glob("AwsSolutions-*NagReport.csv")
    with report.open(newline="") as lines:
        rows = list(csv.DictReader(lines))
    assert rows, "cdk-nag did not run"
    assert {row["Compliance"] for row in rows} <= {"Compliant", "Suppressed"}
    assert all(len(row["Exception Reason"]) > 30 for row in rows if row["Compliance"] == "Suppressed")


def test_every_suppression_written_in_code_has_a_reason(stack: Synthesized) -> None:
    suppressions: list[dict[str, Any]] = [
        rule
        for resource in stack.resources.values()
        for rule in resource.get("Metadata", {}).get("cdk_nag", {}).get("rules_to_suppress", [])
    ]
    assert suppressions
    assert all(len(rule["reason"]) > 30 for rule in suppressions)


@pytest.mark.parametrize("worker", ["cpu", "gpu"])
def test_cfn_lint_finds_nothing_in_what_make_synth_writes(worker: str, tmp_path: Path) -> None:
    """app.py run as ``make synth`` runs it, the only context given the CLI's way (``cdk synth -c``: the environment):
    the layer build skipped, and for a GPU worker its key. The feature flags are cdk.json's, which app.py reads."""
    context = {"skip_layer_build": True} | (GPU_CONTEXT if worker == "gpu" else {})
    environment = os.environ | {"CDK_OUTDIR": str(tmp_path), "CDK_CONTEXT_JSON": json.dumps(context)}
    synth = subprocess.run(
        [sys.executable, "app.py"], cwd=ROOT, env=environment, capture_output=True, text=True, check=False
    )
    assert synth.returncode == 0, synth.stderr
    linted = cfn_lint(tmp_path / "Slsml.template.json")
    assert (linted.returncode, linted.stdout, linted.stderr) == (0, "", "")


def test_cfn_lint_knows_a_gpu_worker_by_the_schema_patch_alone(gpu_synthesized: Synthesized, tmp_path: Path) -> None:
    """Without .cfnlintrc (run elsewhere), cfn-lint's schemas refuse AcceleratorConfig: the patch is what passes."""
    linted = cfn_lint(gpu_synthesized.outdir / f"{gpu_synthesized.stack.stack_name}.template.json", cwd=tmp_path)
    assert linted.returncode != 0
    assert "E3002 Additional properties are not allowed ('AcceleratorConfig' was unexpected)" in linted.stdout


# each change to a GPU worker's properties, and what cfn-lint (with the schema patch) finds in it
BROKEN_GPU_WORKERS = [
    ({"AcceleratorConfig": {"AcceleratorMemorySize": 20}}, "E3030 20 is not one of [3, 6, 12, 16, 24, 48]"),
    ({"AcceleratorConfig": {}}, "E3003 'AcceleratorMemorySize' is a required property"),
    ({"Architectures": ["arm64"]}, "E3002 'x86_64' was expected"),
    ({"PackageType": "Zip"}, "E3002 'Image' was expected"),
    ({"CapacityProviderConfig": None}, "E3021 'CapacityProviderConfig' is a dependency of 'AcceleratorConfig'"),
]


def test_the_schema_patch_checks_what_lambda_requires_of_a_gpu_function(
    gpu_synthesized: Synthesized, tmp_path: Path
) -> None:
    """GPU memory of 3 to 48 GiB, on a container-image x86_64 function with a capacity provider: each broken
    variant's template is linted (in one cfn-lint run) and found wanting for its own reason."""
    worker_id = gpu_synthesized.logical_id(gpu_synthesized.stack.compute.functions["worker"])
    templates = []
    for n, (change, _) in enumerate(BROKEN_GPU_WORKERS):
        template = gpu_synthesized.template.to_json()
        worker = template["Resources"][worker_id]
        worker["Properties"] = {k: v for k, v in (worker["Properties"] | change).items() if v is not None}
        templates.append(tmp_path / f"changed{n}.template.json")
        templates[-1].write_text(json.dumps(template))
    linted = cfn_lint(*templates, "--format", "parseable")
    assert linted.returncode != 0
    # path:line:column:end line:end column:rule:message, a finding a line
    findings = {
        (path, f"{rule} {message}")
        for path, *_, rule, message in (line.split(":", 6) for line in linted.stdout.splitlines())
    }
    for template, (_, finding) in zip(templates, BROKEN_GPU_WORKERS, strict=True):
        assert (str(template), finding) in findings, (template.name, linted.stdout)
