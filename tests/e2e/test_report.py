"""A run's report as a person opens it: a short run with a straggler under quorum 2 of 3, its report written
from the run table and the functions' usage logs, then opened in headless Chromium. The page renders, every
image loaded, and the figures it shows are the run summary's (``runs.summarize``, what ``--json`` prints).

Needs Debian's ``chromium`` and ``chromium-driver`` (``make test`` installs them); without them the test fails,
saying what to install."""

from __future__ import annotations

import json
import shutil
import statistics
import tempfile
from pathlib import Path

import pytest

from slsml.accounting import usage
from slsml.cli import report, report_timeline
from slsml.client import runs
from slsml.local.faults import Faults
from slsml.spec.config import OptimizerConfig, TrainingSpec

from .conftest import finish, train
from .test_faults import injecting

RUN = "report-run"
SPEC = TrainingSpec(
    workers=3,
    reducers=2,
    global_batch=96,
    iterations=6,
    eval_every=2,
    quorum=0.6,
    optimizer=OptimizerConfig(name="adam", learning_rate=3e-3),
)
STRAGGLER = Faults.parse("slow_worker=2:0.5")  # worker 2 reports after the reduce fired with workers 0 and 1
CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
# a closed network: nothing to fetch, update or sync
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1400,1000",
)


@pytest.fixture
def browser():
    missing = [path for path in (CHROMIUM, CHROMEDRIVER) if not Path(path).exists()]
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        missing.append("selenium (pip install -e '.[dev]')")
    if missing:
        pytest.fail(f"no {', '.join(missing)}: apt-get install chromium chromium-driver")
    profile = tempfile.mkdtemp(prefix="slsml-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (*FLAGS, f"--user-data-dir={profile}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def test_a_runs_report_opens_in_a_browser_and_shows_the_runs_summary(local, services, digits, browser, tmp_path):
    with injecting(local, STRAGGLER):
        train(services, SPEC, RUN)
        run = finish(services, RUN)
        assert run.status == "COMPLETED", run.reason
        assert local.host.wait_idle(RUN, timeout_s=60)
    records = usage.read_local(local.log_dir, RUN)
    page = report.write_report(services, records, RUN, tmp_path / "report", chosen=[3])

    run = services.table.get_run(RUN)
    iterations = services.table.list_iterations(RUN)
    summary = runs.summarize(run, iterations, run.updated_at - run.created_at, records)
    expected = summary.model_dump(mode="json")
    seconds = report_timeline.iteration_seconds(iterations)
    slowest = max(seconds, key=seconds.get)
    assert statistics.median(seconds.values()) == summary.median_iteration_s
    assert {r.worker for r in records if r.function == "worker" and r.iteration is not None} == {0, 1, 2}  # which

    browser.get(page.as_uri())
    assert browser.execute_script("return document.readyState") == "complete"
    assert RUN in browser.title
    images = browser.execute_script(
        "return [...document.images].map(i => [i.getAttribute('src'), i.complete, i.naturalWidth])"
    )
    timelines = browser.find_elements("css selector", "h3[id^=iteration-]")
    assert len(images) == 2 + len(timelines) and len(timelines) in {2, 3}, images
    assert all(complete and width > 0 for _, complete, width in images), images

    shown = browser.find_elements("css selector", "[data-field]")
    assert {e.get_attribute("data-field") for e in shown} == set(expected)
    for element in shown:
        name = element.get_attribute("data-field")
        assert json.loads(element.get_attribute("data-value")) == expected[name], name
    headline = {
        e.get_attribute("data-field"): e.text for e in browser.find_elements("css selector", "#headline [data-field]")
    }
    assert headline["status"] == "COMPLETED" and headline["iterations"] == "6"
    assert headline["test_accuracy"] == f"{summary.test_accuracy:.4f}"
    assert headline["test_loss"] == f"{summary.test_loss:.4f}"  # as Keras names them, the loss always
    curves = browser.find_element("css selector", "img[src^=curves]").get_attribute("alt")
    assert curves.startswith("loss, test_loss and accuracy, test_accuracy against"), curves
    tables = [
        [th.text for th in table.find_elements("tag name", "th")]
        for table in browser.find_elements("tag name", "table")
    ]
    assert ["iteration", "wall time", "dollars so far", "test_loss", "test_accuracy"] in tables, tables
    assert ["iteration", "s", "loss", "accuracy", "test_accuracy", "faults", "X-Ray"] in tables, tables
    assert headline["median_iteration_s"] == f"{summary.median_iteration_s:.3f} s"
    assert headline["cost_usd"] == f"${summary.cost_usd:.3g}" and headline["late_workers"] == str(summary.late_workers)
    embedded = browser.find_element("id", "summary-json").get_attribute("textContent")
    assert json.loads(embedded) == expected

    headings = [h.text for h in timelines]
    assert any(h.startswith(f"Iteration {slowest} (slowest") for h in headings), headings
    assert any("median" in h for h in headings) and any(h.startswith("Iteration 3 (") for h in headings), headings
    assert summary.late_workers > 0  # the straggler was left out; the page says where
    faults = browser.find_element("id", "faults").find_element("xpath", "following-sibling::table").text
    late = [r.iteration for r in iterations if r.late]
    assert faults.count("reported after the reduce fired") == len(late) and len(late) == summary.late_workers
    assert "X-Ray traces: none" in browser.find_element("tag name", "body").text

    height = browser.execute_script("return document.body.scrollHeight")
    browser.set_window_size(1400, height + 50)
    screenshot = tmp_path / "report.png"
    assert browser.save_screenshot(str(screenshot)) and screenshot.stat().st_size > 10_000
    print(f"report: {page}; screenshot: {screenshot}")
