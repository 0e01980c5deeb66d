#!/usr/bin/env bash
# On a machine with an NVIDIA GPU and TensorFlow built with CUDA (pip install 'tensorflow[and-cuda]'), in under 8
# minutes:
#   1. `slsml bench gpu`: Keras's ResNet-50 at 224×224 in float32 and mixed_float16, its samples/s and the fraction of
#      the card's published peak that is, at each accelerator memory; the calibration `slsml plan --gpu-calibration`
#      takes for this card;
#   2. the same model as a local GPU worker trains it: one process holding one logical GPU of 24 GiB (what
#      `slsml local up --accelerator worker=24` gives each warm worker process, slsml.local.accelerator.hold_process),
#      a step of three micro-batches of the size the worker takes (slsml.rounds.sizing.AcceleratorMemory), streamed
#      and added up as the worker does (slsml.rounds.stream, slsml.rounds.accumulate); its samples/s and fraction of
#      peak.
# Results go to $OUT (default ./gpu-check): gpu-calibration.json, bench-gpu.json, worker.json, summary.txt.
# Usage: scripts/gpu-check.sh   (PYTHON=/path/to/python to choose the interpreter; run from the repository root)
set -euo pipefail

cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python}"
OUT="${OUT:-gpu-check}"
GIB="${GIB:-24}"
mkdir -p "$OUT"
export PYTHONPATH="$PWD/shared${PYTHONPATH:+:$PYTHONPATH}" KERAS_BACKEND=tensorflow TF_CPP_MIN_LOG_LEVEL=2

if ! nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/card.txt"; then
    echo "gpu-check: no NVIDIA GPU here (nvidia-smi lists none)" >&2
    exit 2
fi

echo "== slsml bench gpu (float32, mixed_float16)" >&2
timeout 330 "$PYTHON" -m slsml.cli.main bench gpu --precisions float32,mixed_float16 --batches 32,128,256 \
    --no-cpu --out "$OUT/gpu-calibration.json" --json >"$OUT/bench-gpu.json"

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
print(
    f"local GPU worker, {worker['accelerator_gib']} GiB, float32: micro-batch {worker['micro_batch']} (sized"
    f" {worker['micro_batch_sized']}) × 3, {worker['samples_per_s']:,.0f} samples/s,"
    f" {'–' if fraction is None else f'{fraction:.1%}'} of peak, device peak {worker['device_peak_gib']:.1f} GiB"
)
PY
