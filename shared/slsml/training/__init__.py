"""Training numerics without AWS: Keras models as flat vectors, numpy optimizers, clipping, the update and
shard formats, error feedback."""
