"""Where every object lives in the bucket. Objects are versioned by iteration, never overwritten.

```
datasets/<name>/manifest.json                 a dataset's manifest (slsml.data.manifest), written last
datasets/<name>/<split>/<index>/shard.bin     one shard of its train or test split
runs/<run>/run.json                           run config (immutable)
runs/<run>/source.keras                       the model as given; the run state machine copies it to…
runs/<run>/models/000000.keras                the model entering iteration 0: the trigger of the first
runs/<run>/models/<iter>.json                 the manifest of the model entering <iter> > 0 (its shards' ETags): the
                                              trigger of each later iteration
runs/<run>/models/<iter>.keras                model entering <iter>, saved where the run may end on it, at
                                              checkpoints (``checkpoint_every``) and for the final one
runs/<run>/final.keras                        the trained model, when the run completed
runs/<run>/iters/<iter>/shards/<shard>/shard.bin  one shard's weights and optimizer state entering <iter>: what
                                              workers read the weights from, by range
runs/<run>/iters/<iter>/updates/<worker>/<attempt>.bin  one worker's update (all shards, see updates.py)
runs/<run>/iters/<iter>/means/<shard>.bin     one shard's averaged gradient, kept for its clipped step
runs/<run>/iters/<iter>/local/<worker>.npz    model averaging: worker slot's local optimizer state after <iter>
runs/<run>/iters/<iter>/residuals/<worker>.bin  compressed updates: worker slot's residual after <iter> (feedback.py)
runs/<run>/iters/<iter>/evaluation/<split>/<worker>.npy  a worker's state of evaluating the model entering <iter>
runs/<run>/iters/<iter>/progress/<worker>-a<attempt>/<steps>.npz  a round handed on to a fresh invocation (progress.py)
incoming/<name>.keras                         drop-in: start a run with the deployment defaults
incoming/<name>.json                          (optional) what to override of those defaults
```

What lies under ``iters/`` is of two kinds. Carried state is what a later iteration, or a resumed run, reads:
the shards entering an iteration and the slots' states and residuals that the workers of the one
before stored (``carried``); it is stored untagged, never expires, and the pipeline deletes each set once it is
superseded. Transient scratch (updates, means, evaluation states, rounds' progress) is read only while its
iteration (and the ``staleness`` iterations after it) run; it carries the tag the bucket's lifecycle rule expires it by.
"""

from __future__ import annotations

import re

MODELS_PREFIX = "runs/"
# The keys of each kind of object a step writes, as IAM resource patterns ("*": any characters, "/" too), by which
# each step's role may write only its own kinds (slsml.spec.wiring) and the bucket's policy refuses overwrites
SCRATCH_OBJECTS = "runs/*/iters/*"
MODEL_OBJECTS = "runs/*/models/*"
FINAL_MODEL_OBJECTS = "runs/*/final.keras"
RUN_CONFIG_OBJECTS = "runs/*/run.json"
SOURCE_MODEL_OBJECTS = "runs/*/source.keras"
INCOMING_PREFIX = "incoming/"
MODEL_SUFFIX = ".keras"
MANIFEST_SUFFIX = ".json"
_INCOMING_KEY = re.compile(r"^incoming/(?P<name>[A-Za-z0-9][A-Za-z0-9_.-]{0,100})\.keras$")
_TRIGGER_KEY = re.compile(
    r"^runs/(?P<run>[a-z0-9][a-z0-9-]{0,62})/models/(?:(?P<first>000000)\.keras|(?P<iter>\d{6})\.json)$"
)


def run_prefix(run_id: str) -> str:
    return f"runs/{run_id}/"


def run_config(run_id: str) -> str:
    return f"{run_prefix(run_id)}run.json"


SOURCE_MODEL = "source.keras"


def source_model(run_id: str) -> str:
    return f"{run_prefix(run_id)}{SOURCE_MODEL}"


def model_name(iteration: int) -> str:
    return f"{iteration:06d}.keras"


def models_prefix(run_id: str) -> str:
    return f"{run_prefix(run_id)}models/"


def model(run_id: str, iteration: int) -> str:
    return f"{models_prefix(run_id)}{model_name(iteration)}"


def manifest(run_id: str, iteration: int) -> str:
    """The manifest of the model entering ``iteration`` (> 0): its shards' ETags, stored by the Merger."""
    return f"{models_prefix(run_id)}{iteration:06d}{MANIFEST_SUFFIX}"


def trigger(run_id: str, iteration: int) -> str:
    """The object that launches ``iteration`` once stored: the initial model (by its S3 event), then each iteration's
    manifest (by the Merger's ModelMerged)."""
    return model(run_id, 0) if iteration == 0 else manifest(run_id, iteration)


def final_model(run_id: str) -> str:
    return f"{run_prefix(run_id)}final.keras"


def iteration_prefix(run_id: str, iteration: int) -> str:
    """Where the objects of ``iteration`` lie."""
    return f"{run_prefix(run_id)}iters/{iteration:06d}/"


def shards_prefix(run_id: str, iteration: int) -> str:
    return f"{iteration_prefix(run_id, iteration)}shards/"


def shard(run_id: str, iteration: int, shard: int) -> str:
    """Each shard under a prefix of its own, as each worker's update: S3's request rates are per prefix, and each
    shard is read by every worker, each update by every reducer."""
    return f"{shards_prefix(run_id, iteration)}{shard:04d}/shard.bin"


def mean(run_id: str, iteration: int, shard: int) -> str:
    return f"{iteration_prefix(run_id, iteration)}means/{shard:04d}.bin"


def update(run_id: str, iteration: int, worker: int, attempt: int = 0) -> str:
    return f"{iteration_prefix(run_id, iteration)}updates/{worker:05d}/{attempt}.bin"


def handed(run_id: str, iteration: int, worker: int, attempt: int, stage: int, micro_batch: int, back: bool) -> str:
    """What pipeline stage ``stage`` of a worker's round (its ``attempt``) hands on for ``micro_batch``: its output to
    the next stage, or (``back``) the gradient of its input back to the stage before (``slsml.pipeline.staged``)."""
    way = "back" if back else "forward"
    return f"{stages_prefix(run_id, iteration, worker, attempt)}{stage:02d}/{way}/{micro_batch:06d}.npy"


def handed_evaluation(
    run_id: str, iteration: int, worker: int, attempt: int, stage: int, split: str, batch: int
) -> str:
    """What pipeline stage ``stage`` hands the next for ``batch`` of the worker's slice of ``split`` as the stages
    evaluate the model entering ``iteration``: its output and the regularization of the stages so far."""
    return f"{stages_prefix(run_id, iteration, worker, attempt)}{stage:02d}/{split}/{batch:06d}.npz"


def stage_part(run_id: str, iteration: int, worker: int, attempt: int, stage: int) -> str:
    """A pipeline stage's part of a worker's update as the first stage takes it: the ETag of its values
    (``stage_values``), its loss and, the last stage's, its metrics."""
    return f"{stages_prefix(run_id, iteration, worker, attempt)}{stage:02d}/part.npz"


def stage_values(run_id: str, iteration: int, worker: int, attempt: int, stage: int) -> str:
    """A pipeline stage's part of a worker's update: its weights' gradients and new non-trainable values, float32, in
    the update's order, which the update's index names and the reducers read by range (``updates.StagedIndex``)."""
    return f"{stages_prefix(run_id, iteration, worker, attempt)}{stage:02d}/part.f32"


def stage_progress(run_id: str, iteration: int, worker: int, attempt: int, stage: int, done: int) -> str:
    """A pipeline stage's round (its ``attempt``) after ``done`` of its forward and backward passes, stored by the
    invocation that handed it on to a fresh one (``slsml.pipeline.staged``)."""
    return f"{stages_prefix(run_id, iteration, worker, attempt)}{stage:02d}/progress/{done:06d}.npz"


def stages_prefix(run_id: str, iteration: int, worker: int, attempt: int) -> str:
    """Where the pipeline stages of a worker's round (its ``attempt``) hand each other what they compute."""
    return f"{iteration_prefix(run_id, iteration)}stages/{worker:05d}-a{attempt}/"


def local_state(run_id: str, iteration: int, worker: int) -> str:
    return f"{iteration_prefix(run_id, iteration)}local/{worker:05d}.npz"


def residual(run_id: str, iteration: int, worker: int) -> str:
    return f"{iteration_prefix(run_id, iteration)}residuals/{worker:05d}.bin"


def progress(run_id: str, iteration: int, worker: int, attempt: int, micro_batches: int) -> str:
    """A worker's round of ``iteration`` (its ``attempt``) after ``micro_batches`` micro-batches, stored by the
    invocation that handed the round on to a fresh one (``slsml.training.progress``)."""
    return f"{iteration_prefix(run_id, iteration)}progress/{worker:05d}-a{attempt}/{micro_batches:06d}.npz"


def evaluation(run_id: str, iteration: int, worker: int, split: str) -> str:
    """A worker's state of evaluating the model entering ``iteration`` on its slice of ``split`` (test, val)."""
    return f"{evaluations_prefix(run_id, iteration, split)}{worker:05d}.npy"


def evaluations_prefix(run_id: str, iteration: int, split: str) -> str:
    return f"{iteration_prefix(run_id, iteration)}evaluation/{split}/"


def dataset_manifest(name: str) -> str:
    return f"datasets/{name}/manifest.json"


def dataset_shards(name: str, split: str) -> str:
    """The prefix of a dataset split's shards."""
    return f"datasets/{name}/{split}/"


def dataset_shard(name: str, split: str, index: int) -> str:
    """Each shard under a prefix of its own, as each shard of a run's weights: S3's request rates are per prefix,
    and the workers read samples of every shard at once."""
    return f"{dataset_shards(name, split)}{index:05d}/shard.bin"


def dataset_shard_index(name: str, split: str, key: str) -> int | None:
    """A key of a shard of ``split`` of dataset ``name`` → its index; anything else → None."""
    match = re.fullmatch(rf"{re.escape(dataset_shards(name, split))}(\d{{5,}})/shard\.bin", key)
    return int(match[1]) if match else None


def parse_model_key(key: str) -> tuple[str, int] | None:
    """A trigger (``runs/<run>/models/000000.keras`` or ``runs/<run>/models/<iter>.json``) → (run, iter); anything
    else (a saved model of a later iteration too) → None."""
    match = _TRIGGER_KEY.fullmatch(key)
    if match is None:
        return None
    return match["run"], int(match["iter"] or 0)


_TRANSIENT_KEY = re.compile(r"^runs/[^/]+/iters/\d{6}/(updates|means|evaluation|progress|stages)/")


def is_transient(key: str) -> bool:
    """Transient scratch (updates, means, evaluation states, rounds' progress, what pipeline stages hand each other):
    no later iteration and no resumed run reads it."""
    return _TRANSIENT_KEY.match(key) is not None


def carried(run_id: str, iteration: int, reducers: int, slots: int, slot_state: bool, residuals: bool) -> list[str]:
    """The carried state entering ``iteration``: its shards, and (where the run keeps them) the slot states and
    residuals that workers ``0…slots-1`` of the iteration before stored."""
    found = [shard(run_id, iteration, r) for r in range(reducers)]
    if iteration > 0:
        found += [local_state(run_id, iteration - 1, w) for w in range(slots) if slot_state]
        found += [residual(run_id, iteration - 1, w) for w in range(slots) if residuals]
    return found


def parse_incoming_key(key: str) -> str | None:
    """``incoming/<name>.keras`` → name; anything else → None."""
    match = _INCOMING_KEY.fullmatch(key)
    return match["name"] if match else None


def incoming_request(name: str) -> str:
    return f"{INCOMING_PREFIX}{name}.json"
