"""Scoring one plan: the evaluator and its parts (costs, priors, fidelity, sensitivity, metrics)."""
