"""The custom metrics of the dashboard (``slsml.spec.deployment.Metric``), emitted through Powertools
Metrics (CloudWatch embedded metric format: one JSON log line per invocation, namespace
``METRICS_NAMESPACE``, dimension ``service``) where each is true:

- ``IterationSeconds``: the Merger, when it stores the next model: seconds since the WorkLauncher
  launched the iteration (its claim, on the iteration's trigger);
- ``TrainLoss``, ``WorkerComputeSeconds``: a Worker, for its finite update (compute: its own);
- ``WorkersDone``: the ReduceLauncher, for each report of a worker it handles;
- ``LateWorkers``: the ReduceLauncher, for each report that comes after the reduce fired without it
  (a quorum below one, or the watchdog's fire at the deadline floor);
- ``DeadlineActions``: the Watchdog, when it fired a barrier, re-launched steps, kept a stale shard or
  failed a run;
- ``RefusedObjects``: a step that read an object its pipeline did not store (an update or a shard that is not the
  one its signed message or its iteration's manifest names, a manifest or a handed-on state without the proof of
  origin of the step that stores it: ``slsml.pipeline.signed.refuse``), its run failing naming it; or that replaced
  one placed at a key before the pipeline stored its own there (``slsml.pipeline.signed.put``);
- ``BytesRead``, ``BytesWritten``: every function that moved S3 bytes in an invocation, as its usage
  lines count them (``slsml.accounting.usage``), by ``envelope.pipeline_handler``.

``emit`` adds to the invocation's set, which ``pipeline_handler`` opens (``emitting``) and Powertools
writes when the invocation ends. Outside a handler (a step called in-process, in a test or a
benchmark) it does nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from aws_lambda_powertools import Metrics
from aws_lambda_powertools.metrics import MetricUnit

from slsml.spec.deployment import Metric

_metrics = Metrics()  # Powertools shares one metric set among all its Metrics objects of a process
_open = False


@contextmanager
def emitting() -> Iterator[None]:
    """Within a pipeline handler's invocation: ``emit`` adds to the set Powertools flushes at its end."""
    global _open
    _open = True
    try:
        yield
    finally:
        _open = False


def emit(metric: Metric, value: float, unit: MetricUnit = MetricUnit.Count) -> None:
    """Add one value of ``metric`` to the invocation's metrics (nothing outside a pipeline handler)."""
    if _open:
        _metrics.add_metric(name=metric.value, unit=unit, value=value)
