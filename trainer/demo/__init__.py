"""The README's main job (``make demo`` → ``python -m trainer demo``) on the embedded default sample.

A program: it may import every other part of ``trainer`` and ``services``; only ``trainer.cli`` imports it.
"""
