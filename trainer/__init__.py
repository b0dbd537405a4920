"""The trainer: data, VERL phases, evaluation, the loop that chains them, and the VERL reward function.

Top level: ``cli`` (``python -m trainer``), ``loop`` (A1…Phase D, resumable), ``rft`` (the RFT
baseline), ``reward_fn`` (VERL's ``compute_score``, named in the phase configs) and ``reward_client``
(its batched reward_api client). Subpackages: ``data``, ``phases``, ``evaluation``, ``demo``,
``smoke``, ``cpu_shim`` (each ``__init__`` says what it owns and may import).
"""
