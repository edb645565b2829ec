"""Evaluation: suites, scorers, model-native tool calling, the Evaluate stage (docs/evaluate.md)."""
