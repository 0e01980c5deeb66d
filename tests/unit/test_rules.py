"""The update rules' interface (``slsml.rules``): one rule per declaration, each its module and one registration line
(a rule added as CONTRIBUTING shows trains with no other edit; no module outside ``rules`` compares a rule's name),
rules the reducer reads without TensorFlow, and each rule's slot traffic in the plan as large as what its worker
stores."""

from __future__ import annotations

import ast
import contextlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import typing
from pathlib import Path

import keras
import numpy as np
import pytest

import slsml
from slsml import rules
from slsml.pipeline.services import Services
from slsml.pipeline.steps.common import load_weights
from slsml.rules.base import UpdateRule
from slsml.spec import keys
from slsml.spec.algorithms import ALGORITHMS
from slsml.spec.config import Algorithm
from slsml.training import modelio, shards, updates

from . import cloud

PACKAGE = Path(slsml.__file__).parent
REPOSITORY = PACKAGE.parents[1]
# where a rule's name may be compared: its own module, and its declaration
RULES_OWN = (PACKAGE / "rules", PACKAGE / "spec" / "algorithms.py")


def test_every_declared_algorithm_has_its_rule_under_its_name() -> None:
    assert list(rules.RULES) == list(ALGORITHMS) == list(typing.get_args(Algorithm))
    assert all(isinstance(rule, UpdateRule) for rule in rules.RULES.values())


def name_comparisons(source: str, names: typing.Collection[str]) -> list[str]:
    """The comparisons in ``source`` that branch on a rule's name: with an ``algorithm`` attribute or variable, or
    with one of ``names``, or a dict literal indexed by ``algorithm``."""

    def named(node: ast.expr) -> bool:
        return (isinstance(node, ast.Attribute) and node.attr == "algorithm") or (
            isinstance(node, ast.Name) and node.id == "algorithm"
        )

    def constant(node: ast.expr) -> bool:
        if isinstance(node, ast.Tuple | ast.List | ast.Set):
            return any(constant(element) for element in node.elts)
        return isinstance(node, ast.Constant) and node.value in names

    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare) and any(named(o) or constant(o) for o in (node.left, *node.comparators)):
            found.append((node.lineno, ast.unparse(node)))
        elif isinstance(node, ast.Match) and named(node.subject):
            found.append((node.lineno, f"match {ast.unparse(node.subject)}"))
        elif isinstance(node, ast.Subscript) and isinstance(node.value, ast.Dict) and named(node.slice):
            found.append((node.lineno, ast.unparse(node)))
    return [f"{line}: {text}" for line, text in sorted(found)]


def test_no_module_outside_the_rules_compares_a_rule_s_name() -> None:
    sources = [*PACKAGE.rglob("*.py"), *(REPOSITORY / "functions").rglob("*.py")]
    outside = [path for path in sources if not any(path.is_relative_to(own) for own in RULES_OWN)]
    assert len(outside) > 80
    found = {
        str(path.relative_to(REPOSITORY)): lines
        for path in outside
        if (lines := name_comparisons(path.read_text(), ALGORITHMS))
    }
    assert found == {}


def test_the_scan_finds_a_comparison_with_a_rule_s_name() -> None:
    source = (
        'if spec.algorithm != "gradient": pass\nif kind in ("admm",): pass\n'
        'x = {"admm": 1}[spec.algorithm]\nmatch algorithm:\n    case _: pass\nif spec.server == "other": pass\n'
    )
    assert name_comparisons(source, ALGORITHMS) == [
        "1: spec.algorithm != 'gradient'",
        "2: kind in ('admm',)",
        "3: {'admm': 1}[spec.algorithm]",
        "4: match algorithm",
    ]


def test_a_rule_added_as_contributing_shows_trains_with_no_other_edit(tmp_path: Path) -> None:
    """CONTRIBUTING's example rule (its module) and its registration line, added to a copy of the package: the
    flag, the display, the plan, the worker and the reducers take it (``added_rule_checks``, in the copy)."""
    section = (REPOSITORY / "CONTRIBUTING.md").read_text().split("## Add an update rule")[1].split("\n## ")[0]
    module, registration = re.findall(r"```python\n(.*?)```", section, flags=re.DOTALL)
    path = re.search(r"module, `(rules/\w+\.py)`", section)
    assert path is not None and registration.count("\n") == 1
    copy = tmp_path / "slsml"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    (copy / path[1]).write_text(module)
    declarations = copy / "spec" / "algorithms.py"
    text = declarations.read_text()
    end = text.index("\n)\n", text.index("DECLARATIONS: ")) + 1  # the table's closing line
    declarations.write_text(text[:end] + registration + text[end:])
    code = "from tests.unit.test_rules import added_rule_checks; added_rule_checks()"
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    env.pop("AWS_ENDPOINT_URL", None)
    ran = subprocess.run([sys.executable, "-c", code], cwd=REPOSITORY, env=env, capture_output=True, text=True)
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert ran.stdout.strip() == f"{copy}: sign"


def added_rule_checks() -> None:
    """In a copy of the package with CONTRIBUTING's sign rule added: ``--algorithm``'s help names it, ``slsml plan
    --algorithm sign`` plans it, a run's line describes it, each worker sends the signs of its gradient, and the
    reducers step SGD with their mean; prints the package's folder and the rule's name."""
    from slsml.cli import display_runs, main
    from slsml.local import moto_server
    from slsml.pipeline.steps import reduce_launcher, reducer

    moto_server.kms_key_pairs()  # as the unit tests' conftest installs them: this runs in a process of its own

    shown = io.StringIO()
    with contextlib.redirect_stdout(shown), pytest.raises(SystemExit):
        main.main(["run", "start", "--help"])
    assert "sign: workers send the signs of their gradient" in " ".join(shown.getvalue().split())
    shown = io.StringIO()
    with contextlib.redirect_stdout(shown):
        assert main.main(["plan", "--algorithm", "sign", "--params", "1000", "--iterations", "3", "--json"]) == 0
    assert json.loads(shown.getvalue())["workload"]["training"]["algorithm"] == "sign"
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(3, activation="softmax")])
    model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
    with pytest.MonkeyPatch.context() as monkeypatch, cloud.moto_services(monkeypatch) as services:
        config = cloud.register_run(services, modelio.save_model(model), "sign", algorithm="sign")
        assert display_runs.describe_update(config).startswith("sign gradients: the reducers step SGD")
        assert services.table.claim_launch("sign", 0, "launch-0", 0, 2) is not None
        done = [cloud.work(services, "sign", 0, worker) for worker in range(2)]
        trainable = config.plan.trainable_mask()
        signs = [
            updates.decode(services.store.get(keys.update("sign", 0, w)), "gradient", config.plan)[0] for w in range(2)
        ]
        assert all(set(np.unique(s[trainable])) <= {-1, 0, 1} for s in signs)
        fired = [message for report in done if report for message in reduce_launcher.on_work_done(report, services)]
        for message in fired:
            reducer.reduce(message, services)
        start = load_weights(services.store, config, 0)
        end = np.concatenate(
            [
                shards.decode(services.store.get(keys.shard("sign", 1, r)), config.plan.shard(r).size).weights
                for r in range(config.plan.reducers)
            ]
        )
        np.testing.assert_allclose((start - end)[trainable], 0.1 * (signs[0] + signs[1])[trainable] / 2, atol=1e-6)
    print(f"{PACKAGE}: {config.training.algorithm}")


def test_the_reducer_reads_the_rules_without_tensorflow() -> None:
    code = (
        "import sys, slsml.rules, slsml.pipeline.steps.reducer; "
        "print(sorted(m for m in ('tensorflow', 'keras') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


@pytest.mark.parametrize(
    "options",
    [
        {
            "algorithm": "average",
            "local_steps": 2,
            "local_state": "keep",
            "local_optimizer": "sgd",
            "local_momentum": 0.9,
        },
        {
            "algorithm": "average",
            "local_steps": 2,
            "local_state": "keep",
            "local_optimizer": "adam",
            "local_learning_rate": 0.01,
        },
        {"algorithm": "admm", "local_steps": 2},
        {"algorithm": "average", "local_steps": 2},
        {"algorithm": "gradient"},
    ],
    ids=["average-keep-momentum", "average-keep-adam", "admm", "average-reset", "gradient"],
)
def test_the_plan_s_slot_traffic_is_what_the_worker_stores(services: Services, options: dict) -> None:
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(3, activation="softmax")])
    model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
    config = cloud.register_run(services, modelio.save_model(model), "slot", **options)
    for iteration in range(2):
        cloud.work(services, "slot", iteration, 0)
    stored = [services.store.get(key) for key in services.store.list_keys("runs/slot/iters/") if "/local/" in key]
    traffic = rules.of(config.training).slot_traffic(
        config.training, config.plan.size, int(config.plan.trainable_mask().sum())
    )
    assert [len(body) for body in stored] == [traffic.bytes] * 2 * traffic.objects
