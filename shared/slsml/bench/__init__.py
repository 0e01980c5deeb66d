"""Benchmarks on the embedded cloud: each prints figures measured side by side in one run."""
