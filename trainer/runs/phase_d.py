"""One Phase D for every recipe: each π1 writes its schemas once (the settings that share a π1 share its
Stage 1), kept on disk under the key of what produced them so that a Phase D cut short does not redo them
(:mod:`trainer.evaluation.stage1_cache`), then each setting's π2 writes its tables on them.

The recipe says how its models are served and where the schemas are kept; the loop serves each setting's
models in turn (one vLLM server at a time on CPU, a GPU each in waves), the A/B experiments on executors they
keep. Scoring and the report are :func:`trainer.evaluation.phase_d.write_outputs`', shared too.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainer.evaluation import two_stage
from trainer.runs.parallel import first_error

if TYPE_CHECKING:
    from shared import GoldenExample
    from trainer.evaluation.generation import GenerationConfig
    from trainer.evaluation.two_stage import ServeModel

# (the settings that share a π1, that π1) -> where its schemas are kept and the key they are kept under
Keep = Callable[[Sequence[str], str], tuple[Path, dict[str, Any]]]


def by_pi1(settings: Mapping[str, tuple[str, str]]) -> dict[str, list[str]]:
    """Each π1 model with the settings that use it, in the settings' order."""
    groups: dict[str, list[str]] = {}
    for name, (pi1, _pi2) in settings.items():
        groups.setdefault(pi1, []).append(name)
    return groups


def score_settings(
    settings: Mapping[str, tuple[str, str]],
    examples: Sequence[GoldenExample],
    gen: GenerationConfig,
    serve: Callable[[str], ServeModel],
    keep: Keep,
    *,
    together: bool,
    say: Callable[[str], None] = print,
    on_stage1: Callable[[Mapping[str, Sequence[str]]], None] | None = None,
) -> dict[str, list[dict[str, Any]]]:
    """Every setting's two-stage records (settings → (π1, π2) models; ``serve(setting)`` serves its models).

    ``together``: every Stage 1 and Stage 2 at once, one thread each (a setting's Stage 2 waits for its π1's
    schemas in its own thread); else one after another, each π1's Stage 1 and then its settings' Stage 2, so
    that one model is served at a time. ``on_stage1`` gets each setting's schemas as soon as every Stage 1 has
    ended (a recipe scores them before Stage 2 ends, so a Phase D cut short still has them)."""
    from trainer.evaluation.stage1_cache import cached_stage1

    groups = by_pi1(settings)

    def stage1(pi1: str) -> list[str]:
        names = groups[pi1]
        label = "+".join(names)
        path, key = keep(names, pi1)
        schemas, kept = cached_stage1(
            path,
            key,
            lambda: two_stage.stage1_schemas(label, pi1, examples, serve(names[0]), gen, two_stage.generate_quietly),
        )
        if kept:
            say(f"[phase D] {label}: π1's schemas from an earlier run of this evaluation ({path})")
        return schemas

    def stage2(name: str, schemas: list[str]) -> list[dict[str, Any]]:
        pi1, pi2 = settings[name]
        return two_stage.run_two_stage(
            name, pi1, pi2, examples, serve(name), gen, two_stage.generate_quietly, schemas=schemas
        )

    def each_setting(schemas: Mapping[str, Sequence[str]]) -> dict[str, list[str]]:
        return {name: list(schemas[pi1]) for name, (pi1, _pi2) in settings.items()}

    if not together:
        out: dict[str, list[dict[str, Any]]] = {}
        written: dict[str, list[str]] = {}
        for pi1, names in groups.items():
            written[pi1] = stage1(pi1)
            if on_stage1 is not None and len(written) == len(groups):
                on_stage1(each_setting(written))
            out.update({name: stage2(name, written[pi1]) for name in names})
        return {name: out[name] for name in settings}
    with ThreadPoolExecutor(max_workers=len(groups) + len(settings)) as pool:
        firsts = {pi1: pool.submit(stage1, pi1) for pi1 in groups}
        seconds = {name: pool.submit(lambda n: stage2(n, firsts[settings[n][0]].result()), name) for name in settings}
        if on_stage1 is not None:
            first_error(list(firsts.values()))
            on_stage1(each_setting({pi1: f.result() for pi1, f in firsts.items()}))
        first_error(list(seconds.values()))
        return {name: seconds[name].result() for name in settings}
