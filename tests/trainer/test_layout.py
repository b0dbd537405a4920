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


def test_top_level_is_small() -> None:
    modules = sorted(p.name for p in TRAINER.glob("*.py"))
    assert len(modules) <= 8, modules


def test_what_verl_loads_by_name_sits_in_in_verl() -> None:
    """The reward function path of the phase configs and the modules the launcher names are in trainer/in_verl."""
    from trainer.phases.launch import CONFIG_DIR, CPU_ENV, FAST_LOGPROBS, PhaseRun
    from trainer.phases.registry import get_phase

    base = (CONFIG_DIR / "grpo_base.yaml").read_text()
    path = base.split("custom_reward_function:")[1].split("path:")[1].split()[0]
    assert path == "${oc.env:TRAINER_REPO_ROOT}/trainer/in_verl/reward_fn.py"
    assert "async def compute_score(" in (TRAINER / "in_verl" / "reward_fn.py").read_text()
    grpo = PhaseRun(get_phase("c1"), "gpu", Path("d"), Path("o"), "m", "http://r").command()
    for module in (FAST_LOGPROBS, CPU_ENV["VERL_USE_EXTERNAL_MODULES"], grpo[2]):
        assert module.startswith("trainer.in_verl."), module
        assert (TRAINER.parent / module.replace(".", "/")).with_suffix(".py").is_file() or (
            TRAINER.parent / module.replace(".", "/") / "__init__.py"
        ).is_file(), module


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
