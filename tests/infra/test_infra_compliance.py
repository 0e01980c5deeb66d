"""cdk-nag (AwsSolutions) and cfn-lint pass on the synthesized stack, and every nag suppression says why."""

from __future__ import annotations

import csv
from typing import TYPE_CHECKING, Any

from aws_cdk.assertions import Annotations, Match
from cfnlint.api import ManualArgs, lint_file

if TYPE_CHECKING:
    from conftest import Synthesized

NAG_FINDING = Match.string_like_regexp("AwsSolutions-.*")
# W3005 (DependsOn already implied by a Ref/GetAtt): CDK itself writes these explicit dependencies.
CFN_LINT_IGNORED = ["W3005"]


def test_cdk_nag_reports_no_unsuppressed_finding(synthesized: Synthesized) -> None:
    annotations = Annotations.from_stack(synthesized.stack)
    assert annotations.find_error("*", NAG_FINDING) == []
    assert annotations.find_warning("*", NAG_FINDING) == []


def test_cdk_nag_report_is_compliant_or_suppressed_with_a_reason(synthesized: Synthesized) -> None:
    (report,) = synthesized.outdir.glob("AwsSolutions-*NagReport.csv")
    with report.open(newline="") as lines:
        rows = list(csv.DictReader(lines))
    assert rows, "cdk-nag did not run"
    assert {row["Compliance"] for row in rows} <= {"Compliant", "Suppressed"}
    assert all(len(row["Exception Reason"]) > 30 for row in rows if row["Compliance"] == "Suppressed")


def test_every_suppression_written_in_code_has_a_reason(synthesized: Synthesized) -> None:
    suppressions: list[dict[str, Any]] = [
        rule
        for resource in synthesized.resources.values()
        for rule in resource.get("Metadata", {}).get("cdk_nag", {}).get("rules_to_suppress", [])
    ]
    assert suppressions
    assert all(len(rule["reason"]) > 30 for rule in suppressions)


def test_cfn_lint_finds_nothing(synthesized: Synthesized) -> None:
    template = synthesized.outdir / f"{synthesized.stack.stack_name}.template.json"
    matches = lint_file(template, config=ManualArgs(ignore_checks=CFN_LINT_IGNORED))
    assert [str(match) for match in matches] == []
