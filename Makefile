# slsml — the two entry points of a fresh clone: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# the AWS CLI that the tests drive the local cloud with, in an environment of its own (its botocore pin)
AWS_CLI_VENV ?= .venv-awscli
AWS_CLI := $(AWS_CLI_VENV)/bin/aws
# headless Chromium and its driver, for the report's browser test (tests/e2e/test_report.py)
CHROMIUM ?= /usr/bin/chromium
CHROMEDRIVER ?= /usr/bin/chromedriver
export JSII_SILENCE_WARNING_DEPRECATED_NODE_VERSION := 1

.PHONY: install browser demo test docs lint synth clean

$(BIN)/slsml: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e ".[dev]"
	touch $@

$(AWS_CLI):
	$(PYTHON) -m venv $(AWS_CLI_VENV)
	$(AWS_CLI_VENV)/bin/pip install --quiet "awscli>=1.36"

install: $(BIN)/slsml

# Chromium and chromedriver from apt where this user may install packages (root, or sudo without a password);
# elsewhere it says what to install, and the rest of the tests run (the browser test fails, naming them)
browser:  ## headless Chromium and its driver, for the report's browser test
	@if [ -x $(CHROMIUM) ] && [ -x $(CHROMEDRIVER) ]; then exit 0; fi; \
	cannot="make: cannot install Chromium and its driver"; \
	then="install them as $(CHROMIUM) and $(CHROMEDRIVER) (tests/e2e/test_report.py fails without them)"; \
	if ! command -v apt-get >/dev/null; then echo "$$cannot (no apt-get here): $$then" >&2; exit 0; fi; \
	if [ "$$(id -u)" = 0 ]; then sudo=; elif sudo -n true 2>/dev/null; then sudo=sudo; else \
		echo "$$cannot (not root, and no sudo without a password): sudo apt-get install chromium chromium-driver" >&2; \
		exit 0; fi; \
	$$sudo apt-get update -qq && $$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium \
		chromium-driver || echo "$$cannot (apt-get failed): $$then" >&2

demo: install  ## train a CNN on digits through the whole pipeline on the embedded cloud
	$(BIN)/slsml demo

lint: install  ## ruff (lint and format), and mypy over the package (pyproject.toml's [tool.mypy])
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

# two test processes, each test file whole in one (its module fixtures run once), each e2e process with an
# embedded cloud of its own: much of an end-to-end test is waiting on the pipeline, so two share two cores well.
# Files go out in collection order (end-to-end first, the many short unit files last), not by their number of
# tests, which would leave the long one-test end-to-end files for the end.
test: install $(AWS_CLI) browser lint  ## lint, then unit, integration, infrastructure and end-to-end tests
	SLSML_AWS_CLI=$(abspath $(AWS_CLI)) $(BIN)/python -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder

docs: install  ## serve the docs site (docs/, with the CLI reference generated) at http://127.0.0.1:8000
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve

synth: install  ## the CloudFormation template, offline
	CDK_OUTDIR=cdk.out $(BIN)/python app.py

clean:
	rm -rf $(VENV) $(AWS_CLI_VENV) cdk.out .slsml runs .pytest_cache .mypy_cache site
