"""Benchmarks behind `gpupool bench` (not tests: they measure, they do not assert)."""
