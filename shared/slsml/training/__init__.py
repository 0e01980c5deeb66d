"""Training numerics without AWS: Keras models as flat vectors and as pipeline stages, numpy optimizers, clipping,
the update and shard formats, error feedback."""
