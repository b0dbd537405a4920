"""Launching a training phase: the launcher (``launch``), sizing by the policy's parameters (``sizing``), one seed
for a GRPO phase (``seeds``), no reward API token in an override (``token_overrides``), checkpoint export
(``export``), the ``run``/``preflight*``/``positive-control``/``export`` commands (``cli``) and the Hydra configs
(``configs/``). What a phase trains is :mod:`trainer.registry.phases`; the rules VERL applies are
:mod:`trainer.phase_rules`; the train sets and their filters are in :mod:`trainer.data`; the checks before RL in
:mod:`trainer.checks`.

Never imports VERL: what runs inside VERL's processes is ``trainer.in_verl``, which the launcher names by
module and path only.
"""
