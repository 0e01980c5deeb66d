"""The local runtime: embedded cloud + function host, as one context manager."""

from __future__ import annotations

from pathlib import Path
from types import TracebackType

from slsml.local.cloud import EmbeddedCloud, LocalDeployment, use_deployment
from slsml.local.host import FunctionHost
from slsml.services import Services


class LocalRuntime:
    """``with LocalRuntime(workers=4, reducers=2) as local: ...`` runs the pipeline on this machine.

    ``workers``/``reducers`` size the warm process pools (the most a run can use at once);
    ``duplicate_deliveries`` delivers every SNS message twice (an at-least-once test switch).
    """

    def __init__(
        self,
        workers: int = 4,
        reducers: int = 2,
        duplicate_deliveries: bool = False,
        log_dir: Path = Path(".slsml/logs"),
        tf_threads: int = 1,
    ) -> None:
        self.cloud = EmbeddedCloud()
        self.concurrency = {
            "work_launcher": 1,
            "worker": workers,
            "reduce_launcher": 2,
            "reducer": reducers,
            "merger": 1,
            "watchdog": 1,
            "run_starter": 1,
        }
        self.duplicate_deliveries = duplicate_deliveries
        self.log_dir = log_dir
        self.tf_threads = tf_threads
        self.deployment: LocalDeployment | None = None
        self.host: FunctionHost | None = None
        self.services: Services | None = None

    def __enter__(self) -> LocalRuntime:
        self.cloud.start()
        try:
            self.deployment = self.cloud.provision()
            use_deployment(self.deployment)
            self.services = Services.from_names(
                self.deployment.bucket,
                self.deployment.table,
                self.deployment.topic_arns,
                self.deployment.state_machine_arn,
                self.deployment.deadline_queue_url,
            )
            self.host = FunctionHost(
                self.deployment, self.concurrency, self.log_dir, self.duplicate_deliveries, self.tf_threads
            )
            self.host.start()
        except BaseException:
            self.cloud.stop()
            raise
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        if self.host is not None:
            self.host.stop()
        self.cloud.stop()
