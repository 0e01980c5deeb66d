"""Unit tests: pure modules, no network. TensorFlow is imported at most once per session (by keras)."""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")
