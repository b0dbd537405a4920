"""The run engine: what every recipe works in (``context.py``: folder, record, GPU plan, held servers, one phase
step), its settings (``config.py``), record (``record.py``), reuse rule (``reuse.py``), servers (``servers.py``),
the Phase D part (``phase_d_part.py``) and C2's data (``c2_data.py``); and the recipes over it: ``trainer loop``
(``loop.py``), ``trainer experiment pi1-ab|pi2-ab`` (``ab_plan.py``, ``ab.py``) and ``trainer experiment sft-choice``
(``sft_choice.py``). The demo (``trainer/demo``) uses its record and reuse rule."""
