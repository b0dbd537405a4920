"""An experiment's folder: where each stage's result lands, so a rerun can tell what is done.

| path | written by |
|---|---|
| ``data/``, ``a1/``, ``a2/`` | data build and SFT (links to ``--sft-from``'s) |
| ``preflight/<phase>_t<T>.json``, ``choice.json``, ``<phase>_improvable.parquet`` | preflight, choice, filter |
| ``data/c2/`` | pi2-ab: π1ˢ's schemas (``data precompute-schemas``) |
| ``train_sets/<phase>_<sources>.parquet`` | ``--rl-sources``: an arm's train split of those sources, before RL |
| ``train_sets/<chosen set>+mix.parquet`` | ``--rl-mix-share``: an arm's chosen set with the other sources mixed in |
| ``<phase>_control/positive_control.json`` | the positive control |
| ``<arm>/phase_result.json`` (``b1``, ``c1`` / ``b2``, ``c2``) | RL |
| ``phase_d/``, ``gold_schema/``, ``gold_schema_eval/``, ``stage1_eval/`` | evaluation |
| ``logs/`` | executors and reward APIs |
| ``experiment_manifest.json`` | the config whole, and each stage's wall time |
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

MANIFEST = "experiment_manifest.json"


@dataclass(frozen=True)
class Workdir:
    root: Path

    @property
    def data(self) -> Path:
        return self.root / "data"

    def phase(self, name: str) -> Path:
        return self.root / name

    @property
    def preflight(self) -> Path:
        return self.root / "preflight"

    def report(self, phase: str, temperature: float) -> Path:
        """The name ``trainer preflight-choose`` reads (``<phase>_t<T>.json``)."""
        return self.preflight / f"{phase}_t{temperature}.json"

    @property
    def choice(self) -> Path:
        return self.preflight / "choice.json"

    def improvable(self, phase: str) -> Path:
        return self.preflight / f"{phase}_improvable.parquet"

    @property
    def train_sets(self) -> Path:
        return self.root / "train_sets"

    def source_set(self, phase: str, sources: tuple[str, ...]) -> Path:
        """``--rl-sources``: the arm's train split restricted to ``sources``."""
        from trainer.phases.train_set import source_set_path

        return source_set_path(self.train_sets, phase, sources)

    def control(self, phase: str) -> Path:
        return self.root / f"{phase}_control"

    @property
    def phase_d(self) -> Path:
        return self.root / "phase_d"

    @property
    def gold_schema(self) -> Path:
        return self.root / "gold_schema"

    @property
    def gold_schema_eval(self) -> Path:
        return self.root / "gold_schema_eval"

    @property
    def stage1_cache(self) -> Path:
        """π1's Phase-D schemas, one file per π1, kept for a rerun (trainer/evaluation/stage1_cache.py)."""
        return self.root / "stage1_cache"

    @property
    def stage1_eval(self) -> Path:
        return self.root / "stage1_eval"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def manifest(self) -> Path:
        return self.root / MANIFEST
