"""The common Lambda layer of the zip functions: layers/common/requirements.txt plus the slsml package,
pip-installed on this machine for the Lambda platform, so synth needs no Docker.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

import jsii
from aws_cdk import BundlingOptions, ILocalBundling
from aws_cdk import aws_lambda as lambda_
from constructs import Construct

ROOT = Path(__file__).resolve().parents[1]
LAYER_DIR = ROOT / "layers" / "common"
PACKAGE_DIR = ROOT / "shared" / "slsml"

RUNTIME = lambda_.Runtime.PYTHON_3_12
ARCHITECTURE = lambda_.Architecture.X86_64
PLATFORM = "manylinux2014_x86_64"
# boto3 and its dependencies ship with the Lambda Python runtime; a copy in the layer would shadow
# the runtime's botocore and could mismatch its boto3.
RUNTIME_PROVIDED = ("boto3", "botocore", "s3transfer", "jmespath", "python-dateutil", "six", "urllib3")


def _normalize(distribution: str) -> str:
    return re.sub(r"[-_.]+", "-", distribution).lower()


@jsii.implements(ILocalBundling)
class PipBundling:
    """Bundles a layer: ``python/`` holds the requirements' Linux wheels and a copy of a local package."""

    def __init__(self, requirements: Path, package: Path, python_version: str) -> None:
        self.requirements = requirements
        self.package = package
        self.python_version = python_version

    def try_bundle(self, output_dir: str, options: BundlingOptions) -> bool:
        site = Path(output_dir) / "python"
        pip = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-compile"]
        platform = ["--platform", PLATFORM, "--implementation", "cp", "--python-version", self.python_version]
        command = [*pip, *platform, "--only-binary=:all:", "--target", str(site), "-r", str(self.requirements)]
        result = subprocess.run(command, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise RuntimeError(f"building the layer failed: {' '.join(command)}\n{result.stderr}")
        _prune(site, RUNTIME_PROVIDED)
        shutil.rmtree(site / "bin", ignore_errors=True)  # console scripts, pointing at this machine's python
        shutil.copytree(self.package, site / self.package.name, ignore=shutil.ignore_patterns("__pycache__"))
        return True


def _prune(site: Path, distributions: Iterable[str]) -> None:
    """Remove the installed files of ``distributions`` (by their RECORD), then empty folders."""
    unwanted = {_normalize(name) for name in distributions}
    for record in list(site.glob("*.dist-info/RECORD")):
        if _normalize(record.parent.name.split("-")[0]) in unwanted:
            for line in record.read_text().splitlines():
                (site / line.split(",")[0]).unlink(missing_ok=True)
    for folder in sorted(site.rglob("*"), key=lambda path: len(path.parts), reverse=True):
        if folder.is_dir() and not any(folder.iterdir()):
            folder.rmdir()


class CommonLayer(Construct):
    """numpy, pydantic, Powertools and slsml for the zip functions."""

    def __init__(self, scope: Construct, construct_id: str, *, build: bool) -> None:
        super().__init__(scope, construct_id)
        python_version = RUNTIME.name.removeprefix("python")
        bundling = BundlingOptions(
            image=RUNTIME.bundling_image,
            local=PipBundling(LAYER_DIR / "requirements.txt", PACKAGE_DIR, python_version),
        )
        # Unbuilt (tests of the stack's shape only): the recipe folder itself, which deploys no packages.
        code = lambda_.Code.from_asset(str(LAYER_DIR), bundling=bundling if build else None)
        self.layer = lambda_.LayerVersion(
            self,
            "Layer",
            code=code,
            compatible_runtimes=[RUNTIME],
            compatible_architectures=[ARCHITECTURE],
            description="numpy, pydantic, Powertools and the slsml package",
        )
