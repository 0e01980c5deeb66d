"""A model's floating-point operations per sample, as TensorFlow's cost analysis counts them: the ops of a traced
``tf.function`` of one sample, each op's ``flops`` statistic (``tf.compat.v1.profiler``'s float_operation: a
multiply-add counts 2). The forward pass alone, and a training step's (the forward pass and the gradient of its
outputs' sum with respect to the trainable weights). TensorFlow is imported when they are counted."""

from __future__ import annotations

from typing import Any, NamedTuple


class Flops(NamedTuple):
    """Floating-point operations of one sample."""

    forward: int
    training: int


def count(model: Any, x: Any) -> Flops:
    """The FLOPs of one sample of ``model``, of input ``x`` (one sample: arrays of batch 1, or named arrays)."""
    import tensorflow as tf

    inputs = tf.nest.map_structure(lambda a: tf.TensorSpec((1, *a.shape[1:]), tf.as_dtype(a.dtype)), x)

    @tf.function
    def forward(x: Any) -> Any:
        return model(x, training=True)

    @tf.function
    def training(x: Any) -> Any:
        with tf.GradientTape() as tape:
            outputs = tf.nest.flatten(model(x, training=True))
            total = tf.add_n([tf.reduce_sum(tf.cast(output, tf.float32)) for output in outputs])
        return tape.gradient(total, model.trainable_variables)

    return Flops(*(_graph_flops(step.get_concrete_function(inputs).graph) for step in (forward, training)))


def _graph_flops(graph: Any) -> int:
    """The float operations of ``graph``'s ops, by their registered ``flops`` statistics."""
    import tensorflow as tf
    from tensorflow.python.profiler import model_analyzer, option_builder

    options = option_builder.ProfileOptionBuilder(option_builder.ProfileOptionBuilder.float_operation())
    verbosity = tf.compat.v1.logging.get_verbosity()
    tf.compat.v1.logging.set_verbosity(tf.compat.v1.logging.ERROR)  # the profiler's own deprecation notices
    try:
        return int(model_analyzer.profile(graph, options=options.with_empty_output().build()).total_float_ops)
    finally:
        tf.compat.v1.logging.set_verbosity(verbosity)
