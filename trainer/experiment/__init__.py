"""Experiments as recipes: the two GPU A/B experiments of the RL phases over the trainer's
shared parts, ``python -m trainer experiment pi1-ab|pi2-ab`` (what ``bench/gpu/ab.sh`` did in shell).

- ``pi1-ab``: from one π1ˢ, B1 (schema reward) beside C1 (pipeline reward, π2ˢ frozen in an executor),
  then Phase D (sft, local, pipe) on the test split.
- ``pi2-ab``: from one π2ˢ, B2 (gold schemas) beside C2 (schemas π1ˢ wrote), then π2 on gold schemas and
  Phase D end to end with π1ˢ.

Stages (``plan.py``): sft (data build, A1 ‖ A2, or ``--sft-from``'s) → preflight (the swept phases at
once; pi2-ab: c2data beside it) → choose (temperature, no-headroom stop, improvable sets) → positive
control (serial, parallel or off) → rl (the two arms) → eval. A stage whose result exists is skipped, so
a rerun goes on, its phases only if trained from the inputs this run would give them (``trainer.runs.reuse``:
otherwise the run stops, naming each difference); each stage's wall time goes to ``experiment_manifest.json``.
Executors started by one stage are kept for the next (eval reuses the preflight's policy, c2data's π1ˢ and
the pipeline reward's π2ˢ); everything started ends with the command, on SIGTERM too
(``trainer/serving/shutdown.py``).

The package: what each experiment compares (``design.py``), its config declared once (``config.py``: the
options of ``cli.py``), the GPU placement of the arms (``placement.py``), the folder (``workdir.py``), the
phase runs it launches (``runs.py``), the plan and ``--dry-run`` (``plan.py``), the servers the stages
share (``services.py``), what every stage works in (``context.py``), the stages (``stages.py``) and the
recipe (``recipe.py``).
"""

from trainer.experiment.config import ExperimentConfig
from trainer.experiment.design import DESIGNS, Design
from trainer.experiment.recipe import Experiment, ExperimentStopped

__all__ = ["DESIGNS", "Design", "Experiment", "ExperimentConfig", "ExperimentStopped"]
