"""Training data: golden JSONL → VERL parquet for every phase (``datasets``), C2's rows from π1's predicted
schemas (``precompute``), the bundled samples.

Imports ``shared``, the phase registry and ``trainer.registry.data_source`` only (no VERL, no services, no executor
client), so data can be built on any machine.
"""
