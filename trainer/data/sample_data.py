"""A small, deterministic golden set that the project generates itself (docs/golden_data.md).

Three kinds of short documents: invoices (multi-row line items), products (one row) and staff
lists (multi-row). Ids are ``<kind>-<split>-<nnn>``, so the data source of an example is its kind.
The committed copy lives in ``trainer/data/sample/``; a test regenerates it and compares bytes.

    python -m trainer.data.sample_data [--out DIR]
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from shared import GoldenExample, golden_filename, write_golden

SAMPLE_DIR = Path(__file__).parent / "sample"
SPLIT_SIZES = {"train": 12, "validation": 6, "test": 6}
SEED = 20261125

_CUSTOMERS = ["Acme Corp", "Blue River Ltd", "Nordlicht GmbH", "Sunrise Foods", "Kite & Co", "Orchid Labs"]
_ITEMS = [("Paper A4", "4.50"), ("Stapler", "12.00"), ("Ink cartridge", "29.90"), ("Desk lamp", "35.00"),
          ("USB cable", "7.25"), ("Notebook", "3.10"), ("Monitor stand", "48.00")]
_PRODUCTS = [("Trail Runner 2", "Stride", "shoes", "89.99"), ("AeroKettle", "HomeWave", "kitchen", "39.50"),
             ("Pixel Pad 10", "Lumen", "tablets", "249.00"), ("Cozy Throw", "Woolly", "home", "24.90"),
             ("Quiet Fan Pro", "Breeze", "appliances", "59.00"), ("Mini Drone X", "SkyBit", "toys", "119.00")]
_COLORS = ["black", "red", "silver", "green", "blue", "white"]
_PEOPLE = [("Ana Silva", "engineer", "Lisbon"), ("Tom Becker", "designer", "Berlin"), ("Mei Chen", "analyst", "Taipei"),
           ("Omar Haddad", "manager", "Amman"), ("Lena Novak", "nurse", "Prague"), ("Raj Patel", "chef", "Pune"),
           ("Sara Lind", "pilot", "Oslo")]


def _table(table_id: str, names: list[str], data: list[list[str | None]]) -> dict[str, Any]:
    cols = [{"name": n} for n in names]
    table = {"table_id": table_id, "columns": cols, "data": data}
    return {"schema": {"table_id": table_id, "columns": cols}, "table": table}


def _invoice(rng: random.Random, ex_id: str) -> tuple[str, dict[str, Any]]:
    number = f"INV-{rng.randint(1000, 9999)}"
    customer = rng.choice(_CUSTOMERS)
    lines = rng.sample(_ITEMS, rng.randint(2, 3))
    qtys = [rng.randint(1, 5) for _ in lines]
    parts = [f"{q} x {name} at {price} EUR" for (name, price), q in zip(lines, qtys, strict=True)]
    text = f"Invoice {number} for {customer}. Items: " + "; ".join(parts) + "."
    data: list[list[str | None]] = [[number, customer, name, str(q), price]
                                    for (name, price), q in zip(lines, qtys, strict=True)]
    return text, _table(ex_id, ["invoice_number", "customer", "item", "quantity", "unit_price"], data)


def _product(rng: random.Random, ex_id: str) -> tuple[str, dict[str, Any]]:
    name, brand, category, price = rng.choice(_PRODUCTS)
    color = rng.choice(_COLORS)
    if rng.random() < 0.5:
        text = f"The {name} by {brand} is a {color} item in our {category} range, priced at ${price}."
        return text, _table(ex_id, ["product_name", "brand", "category", "color", "price"],
                            [[name, brand, category, color, price]])
    # Some product pages omit the colour: then the schema has no colour column.
    text = f"{brand} presents the {name} ({category}), now ${price}."
    return text, _table(ex_id, ["product_name", "brand", "category", "price"], [[name, brand, category, price]])


def _people(rng: random.Random, ex_id: str) -> tuple[str, dict[str, Any]]:
    staff = rng.sample(_PEOPLE, rng.randint(2, 3))
    remote = rng.randrange(len(staff)) if rng.random() < 0.5 else -1
    # A remote worker has no city in the text, so the gold cell is null rather than invented.
    rows: list[list[str | None]] = [[n, r, None if i == remote else c] for i, (n, r, c) in enumerate(staff)]
    sentences = [f"{n} ({r}) works remotely." if c is None else f"{n} ({r}) is based in {c}." for n, r, c in rows]
    return "Team roster: " + " ".join(sentences), _table(ex_id, ["name", "role", "city"], rows)


_KINDS = (("invoice", _invoice), ("product", _product), ("people", _people))


def generate(split: str, n: int, seed: int = SEED) -> list[GoldenExample]:
    """``n`` examples of ``split``, cycling through the kinds; same seed → same examples."""
    rng = random.Random(f"{seed}-{split}")
    out = []
    for i in range(n):
        kind, make = _KINDS[i % len(_KINDS)]
        ex_id = f"{kind}-{split}-{i:03d}"
        text, tables = make(rng, ex_id)
        out.append(GoldenExample.model_validate({"id": ex_id, "split": split, "text": text, **tables}))
    return out


def write_sample(out: Path = SAMPLE_DIR, sizes: dict[str, int] | None = None) -> list[Path]:
    """Write ``common_{split}_schemas.jsonl`` for every split; returns the paths."""
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for split, n in (sizes or SPLIT_SIZES).items():
        path = out / golden_filename(split)
        write_golden(path, generate(split, n))
        paths.append(path)
    return paths


if __name__ == "__main__":
    import typer

    def _main(out: Path = typer.Option(SAMPLE_DIR, help="Output folder.")) -> None:
        for p in write_sample(out):
            typer.echo(p)

    typer.run(_main)
