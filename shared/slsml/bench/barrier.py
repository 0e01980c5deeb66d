"""``slsml bench barrier``: what one report costs the barriers as the fleet grows.

W synthetic WorkDone reports and R ReduceDone reports go through the real ReduceLauncher and Merger
steps against the embedded cloud, for a small fleet and a large one. After each report the items it
wrote are read back and sized by DynamoDB's rules (``slsml.accounting.capacity``): the largest item a report
writes, and the write units of each report (its worker record, and the counter before and after).
"""

from __future__ import annotations

import os
import statistics
import time

from pydantic import BaseModel

from slsml.accounting import capacity
from slsml.aws.storage import etag_of
from slsml.local.cloud import EmbeddedCloud, use_deployment
from slsml.pipeline.services import Services
from slsml.pipeline.steps import merger, reduce_launcher
from slsml.spec import keys
from slsml.spec.config import OptimizerConfig, RunConfig, TrainingSpec, config_digest
from slsml.spec.messages import ReduceDone, WorkDone
from slsml.spec.shardplan import ShardPlan
from slsml.state.records import iteration_sk, participants_sk, run_item, worker_sk
from slsml.training import modelio, optimizers, shards

WITHIN = 0.10  # the large fleet's figures are within this share of the small one's


class BarrierFigures(BaseModel):
    workers: int
    reducers: int
    max_item_bytes: int  # the largest item a report writes (its record, or the counter)
    write_units_per_report: float  # mean over the W work reports: record put + counter update
    max_write_units_per_report: int
    write_units_per_shard_report: float  # mean over the R shard reports: counter update
    participants_item_bytes: int  # written once per iteration, by the fire
    fire_read_units: float  # the fire's BatchGetItem of the W records (each item rounds up to a unit)
    fired: bool  # the reduce fired exactly once, with every worker
    merged: bool  # the merge fired and stored the next model
    seconds_per_report: float  # wall time of one report through the ReduceLauncher on the embedded cloud


class BarrierReport(BaseModel):
    small: BarrierFigures
    large: BarrierFigures
    item_bytes_within: bool
    write_units_within: bool


def _within(large: float, small: float) -> bool:
    return abs(large - small) <= WITHIN * small


def barrier(workers: int = 1000, reducers: int = 10, small_fleet: int = 10) -> BarrierReport:
    import keras

    built = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16), keras.layers.Dense(4)])
    model = modelio.load_model(modelio.save_model(built))  # as the pipeline's functions will see it
    cloud = EmbeddedCloud()
    cloud.start()
    try:
        deployment = cloud.provision()
        use_deployment(deployment)
        # the steps run here: as the Merger, whose role the bucket's policy lets delete superseded carried state
        os.environ.update(deployment.signing_as("merger"))
        services = Services.from_names(
            deployment.bucket,
            deployment.table,
            deployment.topic_arns,
            deployment.state_machine_arn,
            deployment.deadline_queue_url,
        )
        small = _measure(services, model, small_fleet, reducers)
        large = _measure(services, model, workers, reducers)
    finally:
        cloud.stop()
    return BarrierReport(
        small=small,
        large=large,
        item_bytes_within=_within(large.max_item_bytes, small.max_item_bytes),
        write_units_within=_within(large.write_units_per_report, small.write_units_per_report),
    )


def _measure(services: Services, model: object, workers: int, reducers: int) -> BarrierFigures:
    run_id = f"barrier-w{workers}-r{reducers}"
    plan = ShardPlan.build(modelio.variable_specs(model), reducers)
    spec = TrainingSpec(workers=workers, reducers=reducers, global_batch=workers, iterations=10, eval_every=0)
    optimizer = OptimizerConfig(name="sgd", learning_rate=0.1)
    config = RunConfig(
        run_id=run_id,
        dataset="none",
        training=spec,
        optimizer=optimizer,
        loss=modelio.loss_config(model, "mean_squared_error"),
        classification=False,
        plan=plan,
    )
    store, table = services.store, services.table
    store.put_new(keys.run_config(run_id), config.stored())
    store.put_new(keys.model(run_id, 0), modelio.save_model(model))
    table.table.put_item(Item=run_item(run_id, "none", spec, time.time(), config_digest(config.stored())))
    table.claim_launch(run_id, 0, "bench")

    def item(sort_key: str) -> dict:
        return table.table.get_item(Key={"pk": f"RUN#{run_id}", "sk": sort_key}, ConsistentRead=True).get("Item", {})

    counter_sk = iteration_sk(0)
    counter_bytes = capacity.item_bytes(item(counter_sk))
    units, largest, seconds = [], counter_bytes, []
    for worker in range(workers):
        done = WorkDone(
            run_id=run_id, iteration=0, worker=worker, samples=1, loss=0.5, compute_s=0.01, etag=etag_of(b"update")
        )
        started = time.perf_counter()
        reduce_launcher.on_work_done(done, services)
        seconds.append(time.perf_counter() - started)
        record_bytes, after = capacity.item_bytes(item(worker_sk(0, worker))), capacity.item_bytes(item(counter_sk))
        units.append(capacity.write_units(record_bytes) + capacity.write_units(counter_bytes, after))
        largest, counter_bytes = max(largest, record_bytes, after), after
    fire_reads = sum(capacity.read_units(capacity.item_bytes(item(worker_sk(0, w)))) for w in range(workers))
    fired = table.get_iteration(run_id, 0)
    for shard in range(reducers):
        layout = plan.shard(shard)
        weights = modelio.get_flat(model, plan)[layout.start : layout.stop]
        state = optimizers.initial_state(optimizer, int(layout.trainable.sum()))
        store.put_new(keys.shard(run_id, 1, shard), shards.encode(shards.Shard(weights, state, list(range(workers)))))
    shard_units = []
    for shard in range(reducers):
        merger.on_reduce_done(ReduceDone(run_id=run_id, iteration=0, shard=shard), services)
        after = capacity.item_bytes(item(counter_sk))
        shard_units.append(capacity.write_units(counter_bytes, after))
        largest, counter_bytes = max(largest, after), after
    return BarrierFigures(
        workers=workers,
        reducers=reducers,
        max_item_bytes=largest,
        write_units_per_report=statistics.mean(units),
        max_write_units_per_report=max(units),
        write_units_per_shard_report=statistics.mean(shard_units),
        participants_item_bytes=capacity.item_bytes(item(participants_sk(0))),
        fire_read_units=fire_reads,
        fired=fired.reduce_fired_by is not None and [p.worker for p in fired.participants] == list(range(workers)),
        merged=store.exists(keys.trigger(run_id, 1)),
        seconds_per_report=statistics.median(seconds),
    )
