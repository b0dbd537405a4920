"""Training data: golden JSONL → VERL parquet for every phase (``datasets``) and the bundled sample.

Imports ``shared`` only (no VERL, no services), so data can be built on any machine.
"""
