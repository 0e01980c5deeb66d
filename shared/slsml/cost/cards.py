"""GPU cards as the plan times them: a training step's FLOPs ÷ (the card's published peak in the run's precision ×
the fraction of it a training step achieves). The peaks are the makers' datasheets (``DATASHEETS``); the fraction is
measured on the card by ``slsml bench gpu`` (``slsml.cost.calibration``), else an estimate (``estimated_fraction``):
what an A10 achieved in a published ResNet-50 training benchmark."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from slsml.cost.calibration import Precision, card_key

# Keras's ResNet50(weights=None) at 224×224×3, 1,000 classes, one sample, as ``slsml.cost.flops`` counts it
# (TensorFlow 2.21, Keras 3.15): forward 7,797,807,216 (3.9 G multiply-adds), a training step 3.0× that
RESNET50_PARAMS = 25_636_712  # Keras's ResNet50: 102,546,848 B of float32 weights (Parameters.keras_file_overhead)
RESNET50_TRAIN_FLOPS = 23_390_291_294
MEASURE = "measure it: `slsml bench gpu` on a {instance}, then --gpu-calibration FILE"
TF32_DEFAULT = "https://www.tensorflow.org/api_docs/python/tf/config/experimental/enable_tensor_float_32_execution"
LAMBDA_BENCHMARK = "https://github.com/lambdal/deeplearning-benchmark/blob/master/pytorch/pytorch-train-throughput"


class Datasheet(BaseModel):
    """A card's figures as its maker publishes them: dense float32 (on its tensor cores as TF32, where it has them)
    and 16-bit tensor throughput, memory and its bandwidth."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    card: str
    float32_tflops: float
    tf32_tflops: float | None = Field(
        default=None,
        description="float32 on the tensor cores as TF32, dense; None: no such units (before Ampere). TensorFlow"
        f" computes a float32 model's convolutions and matrix products so by default ({TF32_DEFAULT}), as JAX and"
        " PyTorch's cuDNN convolutions do",
    )
    tensor_tflops: float = Field(description="float16 on the tensor cores, dense (without sparsity)")
    bfloat16: bool = Field(default=True, description="whether its tensor cores compute bfloat16 (at float16's rate)")
    memory_gib: int
    memory_gb_s: float
    source: str
    driver_names: tuple[str, ...] = Field(default=(), description="other names its driver (nvidia-smi) gives it")

    @property
    def float32_peak(self) -> float:
        """Its float32 peak as TensorFlow computes float32: TF32's on the tensor cores, where it has them."""
        return self.tf32_tflops or self.float32_tflops

    def tflops(self, mode: Precision) -> float | None:
        """Its peak in ``mode``: ``float32_peak``, or the tensor cores' for mixed precision; None: it has no such
        units."""
        if mode == "float32":
            return self.float32_peak
        return self.tensor_tflops if mode == "mixed_float16" or self.bfloat16 else None

    def described(self) -> str:
        """Its figures, in words."""
        bf16 = "" if self.bfloat16 else ", no bfloat16"
        tf32 = "" if self.tf32_tflops is None else f" ({self.tf32_tflops:g} as TF32 on its tensor cores)"
        return (
            f"{self.float32_tflops:g} TFLOPS float32{tf32}, {self.tensor_tflops:g} TFLOPS float16 tensor (dense){bf16},"
            f" {self.memory_gib} GB at {self.memory_gb_s:g} GB/s"
        )


DATASHEETS = (
    Datasheet(
        card="NVIDIA T4",
        float32_tflops=8.1,
        tensor_tflops=65,
        bfloat16=False,
        driver_names=("Tesla T4",),
        memory_gib=16,
        memory_gb_s=320,
        source="NVIDIA T4 datasheet, https://www.nvidia.com/en-us/data-center/tesla-t4/",
    ),
    Datasheet(
        card="NVIDIA A10G",
        float32_tflops=31.2,
        tf32_tflops=62.5,
        tensor_tflops=125,
        memory_gib=24,
        memory_gb_s=600,
        source="NVIDIA A10 datasheet, https://www.nvidia.com/en-us/data-center/products/a10-gpu/ (the A10G: AWS's"
        " variant, assumed alike)",
    ),
    Datasheet(
        card="NVIDIA L4",
        float32_tflops=30.3,
        tf32_tflops=60,
        tensor_tflops=121,
        memory_gib=24,
        memory_gb_s=300,
        source="NVIDIA L4 datasheet, https://www.nvidia.com/en-us/data-center/l4/ (120 TFLOPS TF32, 242 float16, with"
        " sparsity)",
    ),
    Datasheet(
        card="NVIDIA L40S",
        float32_tflops=91.6,
        tf32_tflops=183,
        tensor_tflops=362.05,
        memory_gib=48,
        memory_gb_s=864,
        source="NVIDIA L40S datasheet, https://www.nvidia.com/en-us/data-center/l40s/ (366 TFLOPS TF32, 733 float16,"
        " with sparsity)",
    ),
    Datasheet(
        card="NVIDIA H100",
        float32_tflops=67,
        tf32_tflops=494.5,
        tensor_tflops=989.5,
        driver_names=("NVIDIA H100 80GB HBM3",),
        memory_gib=80,
        memory_gb_s=3350,
        source="NVIDIA H100 datasheet (SXM), https://www.nvidia.com/en-us/data-center/h100/ (989 TFLOPS TF32, 1,979"
        " float16, with sparsity)",
    ),
    Datasheet(
        card="NVIDIA H200",
        float32_tflops=67,
        tf32_tflops=494.5,
        tensor_tflops=989.5,
        memory_gib=141,
        memory_gb_s=4800,
        source="NVIDIA H200 datasheet (SXM), https://www.nvidia.com/en-us/data-center/h200/ (989 TFLOPS TF32, 1,979"
        " float16, with sparsity)",
    ),
)


class Fraction(BaseModel):
    """The fraction of a card's peak a training step achieves, and where it comes from."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    value: float = Field(gt=0, le=1)
    source: str


# ResNet-50 training (PyTorch) on an A10: Lambda's GPU benchmark, samples/s
_A10_RESNET50 = {
    "float32": (349, f"{LAMBDA_BENCHMARK}-fp32.csv"),
    "mixed_float16": (638, f"{LAMBDA_BENCHMARK}-fp16.csv"),
}


def datasheet(card: str) -> Datasheet | None:
    """The published figures of ``card`` (as slsml or its driver names it); None where slsml has none."""
    key = card_key(card)
    return next((s for s in DATASHEETS if key in {card_key(n) for n in (s.card, *s.driver_names)}), None)


def estimated_fraction(mode: Precision, instance: str) -> Fraction:
    """An estimate of the fraction of any card's peak in ``mode`` a training step achieves: an A10's in Lambda's
    ResNet-50 benchmark (its samples/s × ``RESNET50_TRAIN_FLOPS`` ÷ its datasheet's peak, TF32's for float32: PyTorch
    computes convolutions so by default); bfloat16 as float16."""
    a10 = datasheet("NVIDIA A10G")
    assert a10 is not None
    like: Precision = "float32" if mode == "float32" else "mixed_float16"
    samples_per_s, csv = _A10_RESNET50[like]
    peak = a10.tflops(like)
    assert peak is not None
    value = samples_per_s * RESNET50_TRAIN_FLOPS / (peak * 1e12)
    return Fraction(
        value=value,
        source=f"estimate: an A10's {samples_per_s:g} samples/s of ResNet-50 training in Lambda's GPU benchmark"
        f" (PyTorch, {'float32, its convolutions as TF32' if like == 'float32' else 'float16'}"
        f"{', as bfloat16' if like != mode else ''};"
        f" {csv}) × {RESNET50_TRAIN_FLOPS / 1e9:.2f} GFLOPs a sample ÷ its {peak:g} TFLOPS;"
        f" {MEASURE.format(instance=instance)}",
    )
