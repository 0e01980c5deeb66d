#!/usr/bin/env python3
"""CDK entry point (cdk.json: ``python3 app.py``): synthesizes the slsml stack."""

import sys
from pathlib import Path

# The stack reads the wiring from the same source tree it packages into the functions, not from
# whatever slsml happens to be installed.
sys.path.insert(0, str(Path(__file__).resolve().parent / "shared"))

from infra import create_app

if __name__ == "__main__":
    app, _ = create_app()
    app.synth()
