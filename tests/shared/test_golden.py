import json
from pathlib import Path

import pytest

from shared import GoldenFormatError, read_golden, validate_folder, write_golden
from shared.cli import app
from shared.golden import EmptySplitError

GOOD = {
    "id": "x-1",
    "split": "test",
    "text": "Alimentum is near Burger King.",
    "schema": {"table_id": "x-1", "columns": [{"name": "name"}, {"name": "near"}]},
    "table": {
        "table_id": "x-1",
        "columns": [{"name": "name"}, {"name": "near"}],
        "data": [["Alimentum", "Burger King"]],
    },
}


def _write(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_roundtrip(tmp_path: Path) -> None:
    p = tmp_path / "common_test_schemas.jsonl"
    assert write_golden(p, [GOOD, {**GOOD, "id": "x-2"}]) == 2
    exs = read_golden(p)
    assert [e.id for e in exs] == ["x-1", "x-2"]
    assert exs[0].to_json() == GOOD


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda d: d.pop("text"), "text"),
        (lambda d: d["table"]["data"][0].append("extra"), "table"),
        (lambda d: d["table"]["data"][0].__setitem__(1, 5), "table.data[0][1]"),
        (lambda d: d["schema"]["columns"].append({"name": "name"}), "schema"),
        (lambda d: d["schema"]["columns"][0].pop("name"), "schema.columns[0].name"),
        (lambda d: d["table"]["columns"].reverse(), "(line)"),
    ],
)
def test_bad_line_names_file_line_and_field(tmp_path: Path, mutate, field: str) -> None:
    bad = json.loads(json.dumps(GOOD))
    bad["id"] = "x-2"
    mutate(bad)
    p = _write(tmp_path / "f.jsonl", [json.dumps(GOOD), "", json.dumps(bad)])
    with pytest.raises(GoldenFormatError) as info:
        read_golden(p)
    err = info.value
    assert (err.path, err.line, err.field) == (str(p), 3, field)
    assert str(err).startswith(f"{p}:3: {field}: ")


def test_invalid_json_and_duplicate_id(tmp_path: Path) -> None:
    with pytest.raises(GoldenFormatError, match=r"f\.jsonl:1: \(line\): invalid JSON"):
        read_golden(_write(tmp_path / "f.jsonl", ["{nope"]))
    with pytest.raises(GoldenFormatError, match=r"g\.jsonl:2: id: duplicate id 'x-1' \(first on line 1\)"):
        read_golden(_write(tmp_path / "g.jsonl", [json.dumps(GOOD), json.dumps(GOOD)]))


def test_validate_folder_and_cli(tmp_path: Path) -> None:
    for split in ("train", "validation", "test"):
        write_golden(tmp_path / f"common_{split}_schemas.jsonl", [GOOD])
    stats = validate_folder(tmp_path)
    assert [s.examples for s in stats] == [1, 1, 1]
    assert stats[0].columns_per_schema.mean == 2 and stats[0].rows_per_table.max == 1
    from typer.testing import CliRunner

    res = CliRunner().invoke(app, ["validate", str(tmp_path)])
    assert res.exit_code == 0, res.output
    assert "3 examples valid" in res.output
    (tmp_path / "common_test_schemas.jsonl").write_text('{"id": 1}\n')
    res = CliRunner().invoke(app, ["validate", str(tmp_path)])
    assert res.exit_code == 1 and "common_test_schemas.jsonl:1" in res.output


@pytest.mark.parametrize("empty", ["test", "validation", "train"])
def test_an_empty_split_is_an_error_naming_the_split(tmp_path: Path, empty: str) -> None:
    """A split file without examples (empty, or blank lines only) is refused by ``validate_folder`` and by
    ``shared validate``, which names the split and exits 1 instead of saying "ok"."""
    from typer.testing import CliRunner

    for split in ("train", "validation", "test"):
        write_golden(tmp_path / f"common_{split}_schemas.jsonl", [] if split == empty else [GOOD])
    (tmp_path / f"common_{empty}_schemas.jsonl").write_text("\n\n")
    with pytest.raises(EmptySplitError, match=rf"common_{empty}_schemas\.jsonl: the {empty} split is empty"):
        validate_folder(tmp_path)
    res = CliRunner().invoke(app, ["validate", str(tmp_path)])
    assert res.exit_code == 1 and f"the {empty} split is empty (no examples)" in res.output
    assert "examples valid" not in res.output
    others = [s for s in ("train", "validation", "test") if s != empty]
    assert [s.examples for s in validate_folder(tmp_path, others)] == [1, 1]  # the split not asked for is not read


def test_a_byte_that_is_not_utf8_names_file_line_and_column(tmp_path: Path) -> None:
    """A stray Latin-1 byte (0xe9, "é") on line 2: the reader, ``shared validate`` and ``trainer data build``
    each name the file, the line and the byte, not a bare UnicodeDecodeError or a wrong option."""
    from typer.testing import CliRunner

    good = json.dumps(GOOD).encode()
    bad = json.dumps({**GOOD, "id": "x-2"}).encode().replace(b"Alimentum is", b"Alimentum \xe9s")
    for split in ("train", "validation", "test"):
        (tmp_path / f"common_{split}_schemas.jsonl").write_bytes(good + b"\n" + bad + b"\n")
    f = tmp_path / "common_train_schemas.jsonl"
    column = bad.index(b"\xe9") + 1
    with pytest.raises(GoldenFormatError) as info:
        read_golden(f)
    assert str(info.value) == f"{f}:2: (line): not UTF-8: byte 0xe9 at column {column}"
    res = CliRunner().invoke(app, ["validate", str(tmp_path)])
    assert res.exit_code == 1 and "common_train_schemas.jsonl:2" in res.output and "not UTF-8" in res.output

    from trainer.cli import app as trainer_app

    built = CliRunner().invoke(trainer_app, ["data", "build", "--golden", str(tmp_path), "--out", str(tmp_path / "o"),
                                             "--phases", "a1"])  # fmt: skip
    assert built.exit_code == 2 and "--golden" in built.output and "--phases" not in built.output
    assert "not UTF-8" in built.output
