"""What every layer of the trainer reads and nothing above it writes: the phase registry (``phases``: per phase
its trainer, policy, prompt, ground truth, reward kind, SFT partner and response length) and the ``data_source``
tag of an RL row (``data_source``). Imports ``shared`` only."""
