# slsml — the two entry points of a fresh clone: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
export JSII_SILENCE_WARNING_DEPRECATED_NODE_VERSION := 1

.PHONY: install demo test lint synth clean

$(BIN)/slsml: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e ".[dev]"
	touch $@

install: $(BIN)/slsml

demo: install  ## train a CNN on digits through the whole pipeline on the embedded cloud
	$(BIN)/slsml demo

test: install  ## lint, then unit, integration, infrastructure and end-to-end tests
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q

synth: install  ## the CloudFormation template, offline
	CDK_OUTDIR=cdk.out $(BIN)/python app.py

clean:
	rm -rf $(VENV) cdk.out .slsml runs .pytest_cache
