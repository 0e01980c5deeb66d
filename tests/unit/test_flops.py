"""A model's FLOPs per sample as TensorFlow's cost analysis counts them (``slsml.cost.flops``), against hand counts
(a multiply-add is 2), and the ResNet-50 figure the plan estimates other models by."""

from __future__ import annotations

import itertools

import keras
import numpy as np
import pytest

from slsml.cost import cards, flops
from slsml.cost.parameters import Parameters


def test_dense_layers_count_two_flops_a_weight_forward_and_their_gradients_backward() -> None:
    sizes = (7, 6, 5)
    model = keras.Sequential([keras.Input((sizes[0],)), *(keras.layers.Dense(n) for n in sizes[1:])])
    counted = flops.count(model, np.zeros((1, sizes[0]), np.float32))
    layers = list(itertools.pairwise(sizes))
    forward = sum(2 * n_in * n_out + n_out for n_in, n_out in layers)  # x·W and the bias
    kernels = sum(2 * n_in * n_out for n_in, n_out in layers)  # each kernel's gradient, xᵀ·dy
    inputs = sum(2 * n_in * n_out for n_in, n_out in layers[1:])  # dy·Wᵀ, past the first layer
    assert counted.forward == forward
    assert counted.training == forward + (sizes[-1] - 1) + kernels + inputs  # the outputs' sum, then the gradient


def test_a_convolution_counts_its_multiply_adds_and_both_of_its_gradients() -> None:
    height, width, channels, filters, kernel = 8, 8, 3, 4, 3
    model = keras.Sequential(
        [keras.Input((height, width, channels)), keras.layers.Conv2D(filters, kernel, padding="same", use_bias=False)]
    )
    counted = flops.count(model, np.zeros((1, height, width, channels), np.float32))
    outputs = height * width * filters
    conv = 2 * kernel * kernel * channels * outputs
    assert counted.forward == conv
    # the filter's gradient and the input's (TensorFlow's gradient of Conv2D builds both), and the outputs' sum
    assert counted.training == 3 * conv + outputs - 1


def test_resnet50_counts_as_the_plan_estimates_a_model_by_its_weights() -> None:
    model = keras.applications.ResNet50(weights=None, input_shape=(224, 224, 3), classes=1000)
    counted = flops.count(model, np.zeros((1, 224, 224, 3), np.float32))
    assert model.count_params() == cards.RESNET50_PARAMS
    assert counted.training == cards.RESNET50_TRAIN_FLOPS
    assert 7.7e9 < counted.forward < 8.3e9  # 3.9–4.1 G multiply-adds, as ResNet-50 is usually quoted
    assert 2.9 < counted.training / counted.forward < 3.1  # a training step, about 3× its forward pass
    assert Parameters().train_flops_per_param_sample * model.count_params() == pytest.approx(counted.training)
