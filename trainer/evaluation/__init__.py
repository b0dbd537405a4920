"""Inference and Phase-D evaluation: the executor client, predictions, metrics per setting, the report.

May import ``shared`` and ``trainer.data``; never VERL (evaluation runs against any OpenAI-compatible executor).
"""
