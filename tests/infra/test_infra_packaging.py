"""What the functions ship: the common layer (really built here, with pip) and the TensorFlow image's
build context and Dockerfile (the image itself is built at deploy time, by Docker).
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import TYPE_CHECKING

from aws_cdk import App, Stack

from infra.compute import DOCKERFILE
from infra.layers import ROOT, RUNTIME, RUNTIME_PROVIDED, CommonLayer
from slsml.spec import wiring

if TYPE_CHECKING:
    from conftest import Synthesized

LAYER_LIMIT = 250 * 2**20  # Lambda: function code and layers, unzipped
TENSORFLOW_FUNCTIONS = [fn for fn in wiring.FUNCTIONS if fn.needs_tensorflow]


def test_the_common_layer_holds_linux_wheels_for_the_runtime_and_slsml(tmp_path: Path) -> None:
    app = App(outdir=str(tmp_path))
    stack = Stack(app, "LayerOnly")
    CommonLayer(stack, "Common", build=True)
    template = app.synth().get_stack_by_name("LayerOnly").template
    (layer,) = [r for r in template["Resources"].values() if r["Type"] == "AWS::Lambda::LayerVersion"]
    site = tmp_path / f"asset.{layer['Properties']['Content']['S3Key'].removesuffix('.zip')}" / "python"

    assert (site / "slsml" / "spec" / "wiring.py").is_file()
    for package in ("numpy", "pydantic", "pydantic_settings", "aws_lambda_powertools", "aws_xray_sdk", "cryptography"):
        assert (site / package / "__init__.py").is_file(), package
    abi = RUNTIME.name.replace("python", "cpython-").replace(".", "")  # python3.12 → cpython-312
    assert list(site.glob(f"pydantic_core/*.{abi}-x86_64-linux-gnu.so"))
    assert not [p for p in site.iterdir() if p.name.split("-")[0].lower() in (*RUNTIME_PROVIDED, "bin")]
    assert sum(f.stat().st_size for f in site.rglob("*") if f.is_file()) < LAYER_LIMIT


def _copy_sources(dockerfile: str) -> list[str]:
    return [src for line in dockerfile.splitlines() if line.startswith("COPY ") for src in shlex.split(line)[1:-1]]


def test_the_image_runs_on_the_zip_functions_python_and_holds_every_tensorflow_handler() -> None:
    dockerfile = (ROOT / DOCKERFILE).read_text()
    assert f"FROM public.ecr.aws/lambda/{RUNTIME.name.replace('python', 'python:')}\n" in dockerfile
    for fn in TENSORFLOW_FUNCTIONS:
        assert f"COPY functions/{fn.name}/handler.py ${{LAMBDA_TASK_ROOT}}/{fn.name}/handler.py" in dockerfile


def test_the_image_build_context_holds_what_the_dockerfile_copies_and_no_more(synthesized: Synthesized) -> None:
    image_uris = {
        synthesized.resources[synthesized.logical_id(synthesized.stack.compute.functions[fn.name])]["Properties"][
            "Code"
        ]["ImageUri"]["Fn::Sub"]
        for fn in TENSORFLOW_FUNCTIONS
    }
    (image_uri,) = image_uris  # one image for all TensorFlow steps
    context = synthesized.outdir / f"asset.{image_uri.rsplit(':', 1)[1]}"
    for source in _copy_sources((ROOT / DOCKERFILE).read_text()):
        assert (context / source).exists(), source
    assert {p.name for p in context.iterdir()} == {
        ".dockerignore",
        "README.md",
        "pyproject.toml",
        "functions",
        "shared",
    }
    assert not list(context.rglob("__pycache__"))
