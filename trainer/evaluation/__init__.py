"""Inference and evaluation: the batch generation client of an executor, predictions, scoring samples
through reward_api, Phase D (metrics per setting) and its report.

May import ``shared`` and the phase registry; never VERL (evaluation runs against any OpenAI-compatible
executor) and never the data builders (it writes no training data).
"""
