"""The training phases: registry and launch (``launch``), the VERL entry point (``verl_main``), early
stopping and its VERL hook, checkpoint export, the ``run``/``loop``/``rft``/``export`` commands, ``configs/``.

May import ``shared``, ``trainer.data`` and VERL (VERL only in the modules that run inside its processes).
"""
