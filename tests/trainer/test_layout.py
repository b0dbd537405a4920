"""The trainer's shape (docs/trainer.md, "Layout"): a small top level, no import cycle, programs apart."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

TRAINER = Path(__file__).resolve().parents[2] / "trainer"


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


def test_top_level_is_small_and_keeps_the_reward_function_path() -> None:
    modules = sorted(p.name for p in TRAINER.glob("*.py"))
    assert "reward_fn.py" in modules  # named in users' VERL configs
    assert len(modules) <= 8, modules


@pytest.mark.parametrize("library", ["data", "phases", "evaluation"])
def test_libraries_do_not_import_programs(library: str) -> None:
    graph = import_graph()
    for name, deps in graph.items():
        if name.startswith(f"trainer.{library}"):
            bad = {d for d in deps if d.startswith(("trainer.demo", "trainer.smoke", "trainer.cli"))}
            assert not bad, f"{name} imports programs {bad}"


def test_evaluation_never_imports_verl() -> None:
    for path in (TRAINER / "evaluation").rglob("*.py"):
        tree = ast.parse(path.read_text())
        names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        names |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        assert not any(n.split(".")[0] in ("verl", "ray", "vllm") for n in names), path


# ---- one concept, one owner (issue 24) ----------------------------------------------------------

REPO = TRAINER.parent
SERVING = TRAINER / "serving"


def python_files(*exclude: Path) -> list[Path]:
    """trainer/ and bench/, but not ``exclude`` (files or folders)."""
    files = [*TRAINER.rglob("*.py"), *(REPO / "bench").rglob("*.py")]
    return [p for p in files if not any(p == e or e in p.parents for e in exclude)]


def calls(tree: ast.AST, names: set[str]) -> list[ast.Call]:
    def name(func: ast.expr) -> str:
        return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""

    return [n for n in ast.walk(tree) if isinstance(n, ast.Call) and name(n.func) in names]


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
    """The reward API's environment comes from its typed settings (trainer/serving/reward_api_env.py).
    Exempt: the reward client (it runs inside VERL's workers and imports only ``shared``), which reads
    the token its service also reads and names MAX_TOKENS in its advice."""
    from services.reward_api.settings import Settings

    variables = {f"REWARD_API_{f.upper()}" for f in Settings.model_fields}
    for path in python_files(SERVING, TRAINER / "reward_client.py"):
        named = {v for t in code_strings(ast.parse(path.read_text())) for v in variables if v in t}
        assert not named, f"{path.relative_to(REPO)} spells {sorted(named)}; use trainer.serving.reward_api_env"


def test_only_the_two_stage_runner_builds_stage2_prompts_on_predicted_schemas() -> None:
    """Everywhere else a Stage-2 prompt is built on a gold schema (``<example>.schema_dict()``)."""
    for path in python_files(TRAINER / "evaluation" / "two_stage.py"):
        for call in calls(ast.parse(path.read_text()), {"build_stage2_messages"}):
            schema = call.args[1] if len(call.args) > 1 else None
            gold = (
                isinstance(schema, ast.Call)
                and isinstance(schema.func, ast.Attribute)
                and schema.func.attr == "schema_dict"
            )
            assert gold, f"{path.relative_to(REPO)}:{call.lineno}: a Stage-2 prompt on a predicted schema"
