"""The training loop (A1, A2 →) B1 → B2 → C1 → C2 → Phase-D evaluation (docs/training.md), resumable, with a manifest.

``python -m trainer loop --golden G --out O [--profile cpu-smoke] [--pi1-sft M --pi2-sft M | --base-model M]``

- Without ``--pi1-sft``/``--pi2-sft`` the loop first runs A1 and A2 (SFT from ``--base-model``;
  the cpu-smoke default is SmolLM2-135M-Instruct) and uses their exports as π1ˢ and π2ˢ.
- B1 trains π1ˢ → π1ʳ-local and B2 trains π2ˢ → π2ʳ-local (reward_api without executor).
- C1 trains π1ʳ-local → π1ʳ-pipe; the reward_api's executor serves the frozen π2ʳ-local.
  Locally (no ``--c1-reward-url``) the loop starts a vLLM-CPU executor on π2ʳ-local and a reward_api
  pointed at it; on a cluster, pass the URL of a reward_api whose executor serves π2ʳ-local.
- Before C2, π1ʳ-pipe precomputes the C2 schemas (``trainer.data.precompute.precompute_c2``), served by
  a local vLLM-CPU executor or ``--pi1-pipe-url``.
- C2 trains π2ʳ-local → π2ʳ-pipe. Phase D scores sft / local / pipe end to end on the test split
  (each model served in turn, one vLLM server at a time) and applies the loop-2 rule.
- ``--rft``: the RFT baseline beside RL (``trainer.rft``): π1ˢ and π2ˢ, each served locally,
  sample k outputs per training prompt, reward_api scores them, the best ≥ threshold are kept and
  A1/A2 fine-tune π1ˢ/π2ˢ on them; Phase D adds the setting ``rft``.
- ``--loops 2``: if loop 1's end-to-end gain is ≥ ``--min-gain`` points, C1 → C2 run again from the
  pipe policies (π2ʳ-pipe as the frozen executor) and Phase D compares pipe2 with pipe.

GPU nodes (``--profile gpu``; ``--gpus`` or ``CUDA_VISIBLE_DEVICES``, else every GPU): phases are placed
by :mod:`trainer.serving.gpus`: A1 beside A2 and B1 beside B2 on disjoint halves, the C1 executors of
π2 on GPUs of their own beside the trainer (one GPU: a shared card, memory split), Phase-D settings
side by side. Executors and reward APIs start through :mod:`trainer.serving` only.
``--until sft|local|c1|c2|eval`` stops after that part of the loop, so each documented command fits a
time-limited job; the next command goes on from there.

Resumable: a phase whose ``phase_result.json`` says ok and whose exported model exists is skipped,
as are the built data files; a phase result recorded with other inputs (``phase_inputs.json``: start
model fingerprint, data files' sha256) stops the loop instead of being reused. The C2 precompute
and Phase D are reused only if their content key matches (``precompute_key.json``,
``eval_key.json``: the models' content fingerprints, the golden files' sha256 and the settings);
otherwise they are recomputed. ``loop_manifest.json`` records
the config whole, every input (golden files with sha256), the phase YAMLs' sha256, each phase's command,
checkpoint, exported model and metric, and is rewritten after every step.

External URLs are checked before use: ``--pi1-pipe-url`` must serve π1ʳ-pipe, and
``--c1-reward-url``'s executor must serve the π2 of this round (π2ʳ-local in loop 1, π2ʳ-pipe in
loop 2), by folder (``/v1/models`` ``root``) or by the content hash in the served name
(:mod:`trainer.serving.identity`). A mismatch stops the loop; the manifest's ``served:*``
entries record what was served.

The package: the recipe (``recipe.py``: :class:`Loop`), its config declared once (``config.py``: the
options of ``trainer/loop_cli.py`` and the manifest's ``config`` come from it), the manifest and its
content keys (``manifest.py``), the folder, manifest, GPU plan and reward APIs every step uses
(``workspace.py``), and the steps: one phase (``phase_step.py``), the C2 precompute
(``c2_precompute.py``), Phase D (``phase_d_step.py``), the RFT baseline (``rft_step.py``); and resuming on
another node from the folder's finished work, packed into checked pieces and unpacked there (``artifacts.py``:
``trainer loop pack`` / ``trainer loop unpack``).
"""

from trainer.loop.config import PARTS, LoopConfig
from trainer.loop.manifest import EVAL_KEY, MANIFEST, PRECOMPUTE_KEY
from trainer.loop.phase_d_step import redecide
from trainer.loop.phase_step import phase_done
from trainer.loop.recipe import Loop, StopAfter
from trainer.runs.manifest import Manifest
from trainer.runs.reuse import PHASE_INPUTS, StaleResultError

__all__ = [
    "EVAL_KEY",
    "MANIFEST",
    "PARTS",
    "PHASE_INPUTS",
    "PRECOMPUTE_KEY",
    "Loop",
    "LoopConfig",
    "Manifest",
    "StaleResultError",
    "StopAfter",
    "phase_done",
    "redecide",
]
