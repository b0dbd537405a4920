"""The trainer's shape (docs/trainer.md, "Layout"): every import follows the layout table's "may import"
column, no import cycle, a small top level, what VERL loads in ``trainer/in_verl``."""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TRAINER = REPO / "trainer"
DOC = REPO / "docs" / "trainer.md"
# Top-level names whose imports the table governs: this repository's packages and VERL's stack.
GOVERNED = {"shared", "services", "trainer", "bench", "tests", "verl", "ray", "vllm"}
VERL = ("verl", "ray", "vllm")
PROGRAMS = (
    "trainer.cli", "trainer.runs", "trainer.run_cli", "trainer.transfer", "trainer.rft", "trainer.demo",
    "trainer.smoke",
)  # fmt: skip


def module_name(path: Path) -> str:
    parts = path.relative_to(TRAINER.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def trainer_imports(path: Path) -> set[str]:
    """Every ``trainer.*`` module that ``path`` imports, at module level or inside functions."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == "trainer"}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "trainer":
            found.add(node.module)
            # ``from trainer.evaluation import report`` imports the submodule ``report``.
            found |= {f"{node.module}.{a.name}" for a in node.names}
    return found


def import_graph() -> dict[str, set[str]]:
    modules = {module_name(p): p for p in TRAINER.rglob("*.py")}
    return {name: {m for m in trainer_imports(path) if m in modules and m != name} for name, path in modules.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_no_import_cycle_inside_trainer() -> None:
    cycle = find_cycle(import_graph())
    assert cycle is None, " -> ".join(cycle or [])


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_top_level_is_small() -> None:
    modules = sorted(p.name for p in TRAINER.glob("*.py"))
    assert len(modules) <= 8, modules


def test_what_verl_loads_by_name_sits_in_in_verl() -> None:
    """The reward function path of the phase configs and the modules the launcher names are in trainer/in_verl."""
    from trainer.phases.launch import ALWAYS_LOADED, CONFIG_DIR, CPU_ENV, PhaseRun
    from trainer.registry.phases import get_phase

    base = (CONFIG_DIR / "grpo_base.yaml").read_text()
    path = base.split("custom_reward_function:")[1].split("path:")[1].split()[0]
    assert path == "${oc.env:TRAINER_REPO_ROOT}/trainer/in_verl/reward_fn.py"
    assert "async def compute_score(" in (TRAINER / "in_verl" / "reward_fn.py").read_text()
    grpo = PhaseRun(get_phase("c1"), "gpu", Path("d"), Path("o"), "m", "http://r").command()
    for module in (*ALWAYS_LOADED, CPU_ENV["VERL_USE_EXTERNAL_MODULES"], grpo[2]):
        assert module.startswith("trainer.in_verl."), module
        assert (TRAINER.parent / module.replace(".", "/")).with_suffix(".py").is_file() or (
            TRAINER.parent / module.replace(".", "/") / "__init__.py"
        ).is_file(), module


# ---- the layout table ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    paths: tuple[str, ...]  # repository paths: files, or folders ending in "/"
    allowed: tuple[str, ...]  # module prefixes

    def covers(self, path: str) -> str | None:
        """The path of this row that covers ``path`` (the most specific one), or None."""
        hits = [p for p in self.paths if path == p or (p.endswith("/") and path.startswith(p))]
        return max(hits, key=len, default=None)


def parse_may_import(cell: str) -> tuple[str, ...]:
    """The module prefixes of a "may import" cell: its backticked modules, and VERL's stack for the word VERL.
    Anything else in the cell is an error: the table is the rule, so it says nothing a test cannot check."""
    names = re.findall(r"`([^`]+)`", cell)
    rest = re.sub(r"`[^`]+`", "", cell).replace(",", " ").split()
    unknown = [w for w in rest if w != "VERL"]
    assert not unknown, f"may import {cell!r}: only `module` entries and VERL, not {unknown}"
    for name in names:
        module = re.fullmatch(r"[a-z_][a-z0-9_]*(\.[a-z_][a-z0-9_]*)*", name)
        assert module, f"may import {cell!r}: {name!r} is not a module"
    return (*names, *(VERL if "VERL" in rest else ()))


def layout_rows(text: str | None = None) -> list[Row]:
    text = DOC.read_text() if text is None else text
    section = text.split("\n## Layout\n", 1)[1].split("\n## ", 1)[0]
    lines = [ln for ln in section.splitlines() if ln.startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    assert header == ["where", "what it holds", "may import"], header
    rows = []
    for line in lines[2:]:
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        assert len(cells) == 3, line
        paths = tuple(re.findall(r"`([^`]+)`", cells[0]))
        assert paths and all(p.startswith("trainer/") for p in paths), f"where: {cells[0]!r}"
        rows.append(Row(paths, parse_may_import(cells[2])))
    return rows


def row_of(path: str, rows: list[Row]) -> tuple[Row, str]:
    """The most specific row naming ``path`` (a file before its folder) and the path it names."""
    hits = [(row, hit) for row in rows if (hit := row.covers(path))]
    assert hits, f"{path}: no row of docs/trainer.md's layout table names it"
    best = max(len(hit) for _, hit in hits)
    chosen = [(row, hit) for row, hit in hits if len(hit) == best]
    assert len(chosen) == 1, f"{path}: named by {len(chosen)} rows"
    return chosen[0]


def governed_imports(path: Path) -> list[tuple[int, str]]:
    """(line, dotted name) of every governed import in ``path``; ``from a import b`` gives ``a.b``."""
    found = []
    package = module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolved against the module's package
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parent, *([base] if base else [])])
            found += [(node.lineno, f"{base}.{a.name}") for a in node.names]
    return [(line, name) for line, name in found if name.split(".")[0] in GOVERNED]


def allows(prefixes: tuple[str, ...], name: str) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def violations(rows: list[Row]) -> list[str]:
    bad = []
    for path in sorted(TRAINER.rglob("*.py")):
        rel = path.relative_to(REPO).as_posix()
        row, hit = row_of(rel, rows)
        own = (hit.rstrip("/").replace("/", "."),) if hit.endswith("/") else ()
        for line, name in governed_imports(path):
            if not allows(row.allowed + own, name):
                bad.append(f"{rel}:{line} imports {name} (may import: {', '.join(row.allowed) or 'nothing'})")
    return bad


def test_every_import_follows_the_layout_table() -> None:
    bad = violations(layout_rows())
    assert not bad, "\n".join(bad)


def test_every_row_of_the_table_names_existing_code() -> None:
    for row in layout_rows():
        for p in row.paths:
            assert (REPO / p).is_dir() if p.endswith("/") else (REPO / p).is_file(), p


def test_the_table_keeps_libraries_below_programs_and_off_verl() -> None:
    """What the table may not say: a library (registry, data, evaluation, phases, their rules and checks) importing a
    program, VERL or in_verl."""
    rows = {hit: row for row in layout_rows() for hit in row.paths}
    forbidden = (*PROGRAMS, "trainer.in_verl", *VERL)
    libraries = ("trainer/registry/", "trainer/data/", "trainer/evaluation/", "trainer/phases/", "trainer/phase_rules/",
                 "trainer/checks/")  # fmt: skip
    for lib in libraries:
        for p in rows[lib].allowed:
            reaches = [f for f in forbidden if allows((p,), f) or allows((f,), p)]
            assert not reaches, f"{lib} may import {p}, which reaches {reaches}"


def test_nothing_outside_in_verl_imports_it() -> None:
    """VERL loads ``trainer.in_verl`` by path and module name; no other part of the trainer imports it."""
    for path in TRAINER.rglob("*.py"):
        if (TRAINER / "in_verl") not in path.parents:
            assert not [n for _, n in governed_imports(path) if allows(("trainer.in_verl",), n)], path


def test_the_checker_catches_a_forbidden_import(tmp_path: Path) -> None:
    """A table that forbids what the code does is reported with file and line."""
    text = DOC.read_text().replace(
        "| `shared`, `services.executor_vllm.gguf_source`, `trainer.config_cli`, `trainer.registry`, "
        "`trainer.evaluation.two_stage`, `trainer.evaluation.generation` |",
        "| `shared`, `services.executor_vllm.gguf_source`, `trainer.config_cli`, "
        "`trainer.evaluation.two_stage`, `trainer.evaluation.generation` |",
        1,
    )
    assert text != DOC.read_text()
    bad = violations(layout_rows(text))
    assert any(b.startswith("trainer/data/datasets.py:") and "trainer.registry.phases" in b for b in bad), bad
    with pytest.raises(AssertionError, match="only `module` entries and VERL"):
        parse_may_import("`shared`, anything else")


def test_evaluation_never_imports_verl() -> None:
    for path in (TRAINER / "evaluation").rglob("*.py"):
        tree = ast.parse(path.read_text())
        names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        names |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        assert not any(n.split(".")[0] in ("verl", "ray", "vllm") for n in names), path


# ---- one concept, one owner -------------------------------------------------------------------

SERVING = TRAINER / "serving"


def python_files(*exclude: Path) -> list[Path]:
    """trainer/ and bench/, but not ``exclude`` (files or folders)."""
    files = [*TRAINER.rglob("*.py"), *(REPO / "bench").rglob("*.py")]
    return [p for p in files if not any(p == e or e in p.parents for e in exclude)]


def callee(func: ast.expr) -> str:
    """The called name: ``f`` of ``f(...)`` and of ``module.f(...)``."""
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""


def calls(tree: ast.AST, names: set[str]) -> list[ast.Call]:
    return [n for n in ast.walk(tree) if isinstance(n, ast.Call) and callee(n.func) in names]


def test_servers_are_built_only_in_the_serving_package() -> None:
    """Executors and reward APIs are constructed in trainer/serving/ only (it owns GPU slots, model
    identity, settings and the child processes); everyone else asks it for a URL."""
    servers = {"CpuExecutor", "GpuExecutor", "RewardApiProcess"}
    for path in python_files(SERVING):
        found = calls(ast.parse(path.read_text()), servers)
        assert not found, f"{path.relative_to(REPO)}:{found[0].lineno} starts a server outside trainer/serving/"


def code_strings(tree: ast.AST) -> list[str]:
    """The string constants of the code (docstrings are documentation, not code)."""
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return [
        n.value
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docstrings
    ]


def test_reward_api_settings_are_never_spelled_by_hand() -> None:
    """The reward API's environment comes from its typed settings (trainer/serving/reward_api_env.py), in
    trainer/ and bench/ alike (for trainer/, test_reward_api_variables_are_named_only_in_the_serving_package
    goes further: no ``REWARD_API_`` at all, docstrings and configs included)."""
    from services.reward_api.settings import Settings

    variables = {f"REWARD_API_{f.upper()}" for f in Settings.model_fields}
    for path in python_files(SERVING):
        named = {v for t in code_strings(ast.parse(path.read_text())) for v in variables if v in t}
        assert not named, f"{path.relative_to(REPO)} spells {sorted(named)}; use trainer.serving.reward_api_env"


def test_reward_api_variables_are_named_only_in_the_serving_package() -> None:
    """``REWARD_API_*`` (the reward API's settings prefix) appears in trainer/ only under trainer/serving/:
    the launcher reads the user's ``REWARD_API_URL``/``_TOKEN`` through ``trainer.serving.reward_api_env``
    and hands VERL's processes ``TRAINER_REWARD_URL``/``_TOKEN``; code, configs and scripts alike."""
    files = [p for ext in ("py", "yaml", "sh") for p in TRAINER.rglob(f"*.{ext}") if SERVING not in p.parents]
    named = sorted(str(p.relative_to(REPO)) for p in files if "REWARD_API_" in p.read_text())
    assert not named, f"REWARD_API_ spelled outside trainer/serving/ in: {', '.join(named)}"


HANDOFF = REPO / "shared" / "handoff.py"  # the Stage 1 → Stage 2 hand-off
PROMPTS = REPO / "shared" / "prompts.py"  # the prompt builders themselves


def handoff_scope() -> list[Path]:
    """The code that may not build a Stage-2 prompt on a predicted schema: trainer/, bench/, services/ and
    shared/, but not the hand-off and the builders."""
    files = [*python_files(), *(REPO / "services").rglob("*.py"), *(REPO / "shared").rglob("*.py")]
    return [p for p in files if p not in (HANDOFF, PROMPTS)]


def prompts_on_predicted_schemas(source: str) -> list[int]:
    """Lines of ``source`` that build a Stage-2 prompt on anything but a gold schema: a ``build_stage2_messages``
    whose schema (second positional argument) is not ``<example>.schema_dict()``, or any ``stage2_schema``."""
    lines = []
    for call in calls(ast.parse(source), {"build_stage2_messages", "stage2_schema"}):
        schema = call.args[1] if len(call.args) > 1 else None
        gold = (
            callee(call.func) == "build_stage2_messages"
            and isinstance(schema, ast.Call)
            and isinstance(schema.func, ast.Attribute)
            and schema.func.attr == "schema_dict"
        )
        if not gold:
            lines.append(call.lineno)
    return sorted(lines)


def test_only_the_handoff_builds_stage2_prompts_on_predicted_schemas() -> None:
    """The Stage 1 → Stage 2 hand-off has one home, ``shared/handoff.py`` (``shared.stage2_handoff``): the
    reward service and the trainer alike go through it; everywhere else a Stage-2 prompt is built on a gold
    schema (``<example>.schema_dict()``)."""
    bad = [
        f"{path.relative_to(REPO)}:{line}: a Stage-2 prompt on a predicted schema; use shared.stage2_handoff"
        for path in handoff_scope()
        for line in prompts_on_predicted_schemas(path.read_text())
    ]
    assert not bad, "\n".join(bad)


def test_the_service_and_the_two_stage_runner_hand_off_through_shared() -> None:
    for path in (REPO / "services" / "reward_api" / "pipeline.py", TRAINER / "evaluation" / "two_stage.py"):
        assert calls(ast.parse(path.read_text()), {"stage2_handoff"}), f"{path.relative_to(REPO)}: no stage2_handoff"


def test_the_handoff_guard_catches_a_prompt_on_a_predicted_schema() -> None:
    source = (
        "build_stage2_messages(ex.text, ex.schema_dict())\n"
        "shared.build_stage2_messages(item.text, item.prediction, template)\n"
        "build_stage2_messages(text, schema=ex.schema_dict())\n"
        "stage2_schema(prediction)\n"
    )
    assert prompts_on_predicted_schemas(source) == [2, 3, 4]
    assert REPO / "services" / "reward_api" / "pipeline.py" in handoff_scope()
    assert HANDOFF not in handoff_scope()
