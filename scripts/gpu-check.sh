#!/usr/bin/env bash
# On a machine with an NVIDIA GPU and TensorFlow built with CUDA (pip install 'tensorflow[and-cuda]') or, without it,
# JAX built with CUDA (Keras then trains on its JAX backend), in under 8 minutes:
#   1. `slsml bench gpu`: Keras's ResNet-50 at 224×224 in float32 and mixed_float16, its samples/s and the fraction of
#      the card's published peak that is, at each accelerator memory; the calibration `slsml plan --gpu-calibration`
#      takes for this card;
#   2. the same model as a local GPU worker trains it: one process holding one logical GPU of 24 GiB (what
#      `slsml local up --accelerator worker=24` gives each warm worker process, slsml.local.accelerator.hold_process),
#      a step of three micro-batches of the size the worker takes (slsml.rounds.sizing.AcceleratorMemory), streamed
#      and added up as the worker does (slsml.rounds.stream, slsml.rounds.accumulate); its samples/s and fraction of
#      peak. On JAX, whose Keras slsml's worker does not train on, the same micro-batches in one device memory of
#      24 GiB (XLA_PYTHON_CLIENT_MEM_FRACTION), added up by Keras's optimizer (gradient_accumulation_steps).
# Results go to $OUT (default ./gpu-check): gpu-calibration.json, bench-gpu.json, worker.json, summary.txt.
# Usage: scripts/gpu-check.sh   (PYTHON=/path/to/python to choose the interpreter; run from the repository root)
set -euo pipefail

cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python}"
OUT="${OUT:-gpu-check}"
GIB="${GIB:-24}"
mkdir -p "$OUT"
export PYTHONPATH="$PWD/shared${PYTHONPATH:+:$PYTHONPATH}" TF_CPP_MIN_LOG_LEVEL=2

if ! nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/card.txt"; then
    echo "gpu-check: no NVIDIA GPU here (nvidia-smi lists none)" >&2
    exit 2
fi
if "$PYTHON" -c "import tensorflow as tf, sys; sys.exit(not tf.config.list_physical_devices('GPU'))" 2>/dev/null; then
    export KERAS_BACKEND=tensorflow
elif "$PYTHON" -c "import jax, sys; sys.exit(not any(d.platform == 'gpu' for d in jax.devices()))" 2>/dev/null; then
    export KERAS_BACKEND=jax
else
    echo "gpu-check: neither TensorFlow nor JAX sees the GPU: install one built with CUDA" >&2
    exit 2
fi
echo "Keras on $KERAS_BACKEND" | tee -a "$OUT/card.txt"

echo "== slsml bench gpu (float32, mixed_float16)" >&2
timeout 330 "$PYTHON" -m slsml.cli.main bench gpu --precisions float32,mixed_float16 --batches 32,128,256 \
    --no-cpu --out "$OUT/gpu-calibration.json" --json >"$OUT/bench-gpu.json"

if [ "$KERAS_BACKEND" = jax ]; then
echo "== ResNet-50 in a GPU worker's micro-batches, $GIB GiB of device memory (float32, Keras on JAX)" >&2
MIB=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
XLA_PYTHON_CLIENT_PREALLOCATE=true XLA_PYTHON_CLIENT_MEM_FRACTION=$("$PYTHON" -c "print($GIB * 1024 / $MIB)") \
timeout 170 "$PYTHON" - "$GIB" "$OUT/worker.json" <<'PY'
"""A step of three of a GPU worker's micro-batches of ResNet-50 at 224x224, added up by Keras's optimizer, timed."""
import json
import sys
import time

import jax
import keras
import numpy as np

from slsml.bench.gpu import achieved, card
from slsml.cost.cards import RESNET50_TRAIN_FLOPS, datasheet
from slsml.rounds import sizing

gib, written = int(sys.argv[1]), sys.argv[2]
model = keras.applications.ResNet50(weights=None, input_shape=(224, 224, 3), classes=1000)
memory = sizing.AcceleratorMemory(gib, 4 * model.count_params(), sizing.sample_bytes(model), "float32")
sized = micro_batch = memory.micro_batch()
rng = np.random.default_rng(0)
while True:  # the worker's micro-batch; where the step does not fit it, the largest half that does
    model.compile(keras.optimizers.SGD(0.01, gradient_accumulation_steps=3), "sparse_categorical_crossentropy")
    x = rng.random((3 * micro_batch, 224, 224, 3), dtype=np.float32)
    y = rng.integers(0, 1000, 3 * micro_batch)
    try:
        times = []
        for _ in range(4):  # the first compiles
            started = time.perf_counter()
            for k in range(3):
                part = slice(k * micro_batch, (k + 1) * micro_batch)
                model.train_on_batch(x[part], y[part])
            times.append(time.perf_counter() - started)
        break
    except Exception as error:  # noqa: BLE001 - out of memory: a smaller micro-batch
        text = f"{type(error).__name__} {error}"
        if not any(mark in text for mark in ("RESOURCE_EXHAUSTED", "out of memory")) or micro_batch < 2:
            raise
        micro_batch //= 2
name = datasheet(card()[0]).card
rate = 3 * micro_batch / min(times[1:])
stats = jax.local_devices()[0].memory_stats()
result = {
    "card": name,
    "backend": "jax",
    "accelerator_gib": gib,
    "device_limit_gib": stats["bytes_limit"] / 2**30,
    "precision": "float32",
    "micro_batch_sized": sized,
    "micro_batch": micro_batch,
    "micro_batches": 3,
    "step_seconds": times[1:],
    "samples_per_s": rate,
    "train_flops_per_sample": RESNET50_TRAIN_FLOPS,
    "achieved_fraction": achieved(name, "float32", rate, RESNET50_TRAIN_FLOPS),
    "device_peak_gib": stats["peak_bytes_in_use"] / 2**30,
}
with open(written, "w") as out:
    json.dump(result, out, indent=2)
PY
else
echo "== ResNet-50 on a local GPU worker of $GIB GiB (float32)" >&2
timeout 140 "$PYTHON" - "$GIB" "$OUT/worker.json" <<'PY'
"""One local GPU worker's step of ResNet-50 at 224x224, in the worker's micro-batches, timed."""
import json
import sys
import time

from slsml.local import accelerator

gib, written = int(sys.argv[1]), sys.argv[2]
accelerator.hold_process(gib)  # before TensorFlow first runs, as a warm worker process does

import keras  # noqa: E402
import numpy as np  # noqa: E402

from slsml.bench.gpu import achieved, card  # noqa: E402
from slsml.bench.microbatch import samples  # noqa: E402
from slsml.cost import flops  # noqa: E402
from slsml.rounds import accumulate, sizing, stream  # noqa: E402
from slsml.spec.shardplan import ShardPlan  # noqa: E402
from slsml.training import modelio  # noqa: E402

STEPS = 3
loss = json.dumps("sparse_categorical_crossentropy")
model = keras.applications.ResNet50(weights=None, input_shape=(224, 224, 3), classes=1000)
trainer = modelio.Trainer(model, ShardPlan.build(modelio.variable_specs(model), 1), loss)
memory = sizing.AcceleratorMemory(gib, 4 * model.count_params(), sizing.sample_bytes(model), "float32")
sized = micro_batch = memory.micro_batch()
counted = flops.count(model, np.zeros((1, 224, 224, 3), np.float32)).training
while True:  # the worker's micro-batch; where TensorFlow's step does not fit it, the largest half that does
    share = 3 * micro_batch
    x, y = samples(model, loss, share)
    try:
        trainer.compute_update(x[:micro_batch], y[:micro_batch])  # traces the step
        times = []
        for _ in range(STEPS):
            started = time.perf_counter()
            with stream.Stream(lambda taken: (x[taken], y[taken], None), [np.arange(share)], micro_batch) as read:
                accumulate.step_update(trainer, read.steps[0])
            times.append(time.perf_counter() - started)
        break
    except Exception as error:  # noqa: BLE001 - out of memory: a smaller micro-batch
        text = f"{type(error).__name__} {error}"
        if not any(mark in text for mark in ("ResourceExhausted", "RESOURCE_EXHAUSTED", "OOM")) or micro_batch < 2:
            raise
        micro_batch //= 2
name, _ = card()
rate = share / min(times)
peak = int(__import__("tensorflow").config.experimental.get_memory_info("GPU:0")["peak"])
result = {
    "card": name,
    "backend": "tensorflow",
    "accelerator_gib": gib,
    "precision": "float32",
    "micro_batch_sized": sized,
    "micro_batch": micro_batch,
    "micro_batches": 3,
    "step_seconds": times,
    "samples_per_s": rate,
    "train_flops_per_sample": counted,
    "achieved_fraction": achieved(name, "float32", rate, counted),
    "device_peak_gib": peak / 2**30,
}
with open(written, "w") as out:
    json.dump(result, out, indent=2)
PY
fi

"$PYTHON" - "$OUT" <<'PY' | tee "$OUT/summary.txt"
import json
import sys
from pathlib import Path

out = Path(sys.argv[1])
calibration = json.loads((out / "gpu-calibration.json").read_text())
print(f"card: {calibration['card']}; ResNet-50 training: {calibration['train_flops_per_sample'] / 1e9:.2f} GFLOPs a sample")
for entry in calibration["entries"]:
    fraction = entry["achieved_fraction"]
    print(
        f"slsml bench gpu, {entry['accelerator_gib']} GiB, {entry['precision']}: micro-batch {entry['micro_batch']},"
        f" {entry['samples_per_s']:,.0f} samples/s, {'–' if fraction is None else f'{fraction:.1%}'} of peak"
    )
worker = json.loads((out / "worker.json").read_text())
fraction = worker["achieved_fraction"]
where = "local GPU worker" if worker["backend"] == "tensorflow" else "a GPU worker's micro-batches, Keras on JAX"
print(
    f"{where}, {worker['accelerator_gib']} GiB, float32: micro-batch {worker['micro_batch']} (sized"
    f" {worker['micro_batch_sized']}) × 3, {worker['samples_per_s']:,.0f} samples/s,"
    f" {'–' if fraction is None else f'{fraction:.1%}'} of peak, device peak {worker['device_peak_gib']:.1f} GiB"
)
PY
