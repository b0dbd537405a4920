"""The training phases: the registry (``registry``), launch (``launch``), the rules VERL's processes apply
(early stopping, the failure policy, the monitors), GPU placement, checkpoint export, the checks before RL
(preflight, positive control), the ``run``/``loop``/``preflight``/``positive-control``/``rft``/``export``
commands, ``configs/``.

Never imports VERL: what runs inside VERL's processes is ``trainer.in_verl``, which the launcher names by
module and path only.
"""
