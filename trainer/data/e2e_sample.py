"""The bundled E2E sample: the embedded default data of the demo, and its builder.

    python -m trainer.data.e2e_sample [--golden ../shared/data/golden] [--out trainer/data/e2e_sample]

Only E2E examples (ids ``e2e-…``) are taken; RotoWire is for research use only and never bundled.
Each output split comes from the same golden split, whose sources are already split by meaning
representation (MR), so no MR is shared between the bundled train, validation and test files.
Within a split, one reference text per MR is kept (more distinct MRs teach more than several
paraphrases of one), and MRs and references are chosen by a seeded hash: the same golden files,
sizes and seed always give the same bytes. ``sample_manifest.json`` records the inputs (sha256),
sizes and seed, so a test can rebuild the files and compare.
"""

from __future__ import annotations

import hashlib
import json
from collections import defaultdict
from pathlib import Path

import typer

from shared import GoldenExample, golden_filename, read_golden, write_golden
from shared.golden import sha256_file

# Beside the files: LICENSE (CC BY-SA 4.0) and ATTRIBUTION.md (Novikova et al. 2017; Dušek et al. 2019).
E2E_SAMPLE_DIR = Path(__file__).parent / "e2e_sample"
REPO = Path(__file__).resolve().parents[2]

E2E_PREFIX = "e2e-"
DEFAULT_SIZES = {"train": 300, "validation": 40, "test": 60}
DEFAULT_SEED = "e2e-sample-v1"
MANIFEST = "sample_manifest.json"


def _rank(seed: str, key: str) -> str:
    return hashlib.sha256(f"{seed}\x00{key}".encode()).hexdigest()


def mr_key(ex: GoldenExample) -> str:
    """The meaning representation of an E2E example: its gold table (attribute names and values)."""
    return json.dumps([[c.name for c in ex.table.columns], ex.table.data], ensure_ascii=False)


def select(examples: list[GoldenExample], n: int, seed: str) -> list[GoldenExample]:
    """``n`` E2E examples with distinct MRs, one reference each, in the source's order."""
    by_mr: dict[str, list[GoldenExample]] = defaultdict(list)
    for ex in examples:
        if ex.id.startswith(E2E_PREFIX):
            by_mr[mr_key(ex)].append(ex)
    if n > len(by_mr):
        raise ValueError(f"size: asked for {n} examples with distinct MRs, the split has only {len(by_mr)}")
    mrs = sorted(by_mr, key=lambda k: _rank(seed, k))[:n]
    chosen = {min(by_mr[k], key=lambda ex: _rank(seed, ex.id)).id for k in mrs}
    return [ex for ex in examples if ex.id in chosen]


def build(golden: Path, out: Path, sizes: dict[str, int], seed: str) -> dict[str, dict[str, object]]:
    """Write the three splits and the manifest; returns ``{file name: {examples, sha256}}``."""
    out.mkdir(parents=True, exist_ok=True)
    inputs: dict[str, str] = {}
    outputs: dict[str, dict[str, object]] = {}
    for split, n in sizes.items():
        src = golden / golden_filename(split)
        picked = select(read_golden(src), n, seed)
        dst = out / golden_filename(split)
        write_golden(dst, picked)
        inputs[src.name] = sha256_file(src)
        outputs[dst.name] = {"examples": len(picked), "sha256": sha256_file(dst)}
    manifest: dict[str, object] = {
        "source": "E2E (cleaned) examples of the project's golden data; RotoWire excluded",
        "seed": seed,
        "sizes": sizes,
        "inputs": inputs,
        "outputs": outputs,
    }
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return outputs


def main(
    golden: Path = typer.Option(REPO.parent / "shared" / "data" / "golden", help="Golden folder (E2E + RotoWire)."),
    out: Path = typer.Option(E2E_SAMPLE_DIR, help="Output folder."),
    train: int = typer.Option(DEFAULT_SIZES["train"], help="Train examples (distinct MRs)."),
    validation: int = typer.Option(DEFAULT_SIZES["validation"], help="Validation examples (distinct MRs)."),
    test: int = typer.Option(DEFAULT_SIZES["test"], help="Test examples (distinct MRs)."),
    seed: str = typer.Option(DEFAULT_SEED, help="Selection seed (any string)."),
) -> None:
    """Write common_{train,validation,test}_schemas.jsonl and sample_manifest.json under OUT."""
    outputs = build(golden, out, {"train": train, "validation": validation, "test": test}, seed)
    for name, info in outputs.items():
        print(f"{out / name}: {info['examples']} examples")


if __name__ == "__main__":  # pragma: no cover
    typer.run(main)
