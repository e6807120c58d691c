"""Gradient-check samples, one module per op family: SAMPLES = {"Op": [Sample, ...]}."""
