"""The trainer: data, VERL phases, evaluation, and the loop that chains them.

Top level: ``cli`` (``python -m trainer``), ``loop`` (A1…Phase D, resumable), ``rft`` (the RFT
baseline), ``reward_client`` (the typed client of the reward API). Subpackages: ``data``, ``phases`` (the
phase registry, launch, the rules of a phase),
``in_verl`` (everything that runs inside VERL's processes: the reward function, the trainer subclass,
the CPU shim), ``evaluation``, ``demo``, ``smoke``. docs/trainer.md's layout table says what each may
import; tests/trainer/test_layout.py holds them to it.
"""
