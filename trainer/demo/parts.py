"""The demo's parts (prepare, Phase D base, A1/A2 SFT, ...) with times, and the progress bars of the long
ones (generation, SFT steps). "Stage" is kept for the prompt stages 1 and 2."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

T = TypeVar("T")


class PartClock:
    """Prints ``[i/n] name`` when a part of the demo starts and ``done in N s`` when it ends; keeps the times."""

    def __init__(self, console: Console, total: int) -> None:
        self.console = console
        self.total = total
        self.seconds: dict[str, float] = {}
        self._t0 = time.monotonic()

    @contextlib.contextmanager
    def part(self, name: str, note: str = "") -> Iterator[None]:
        i = len(self.seconds) + 1
        self.console.rule(f"[bold][{i}/{self.total}] {name}[/bold]" + (f"  [dim]{note}[/dim]" if note else ""))
        t = time.monotonic()
        try:
            yield
        finally:
            dt = time.monotonic() - t
            self.seconds[name] = round(dt, 1)
            self.console.print(f"[green]✓[/green] {name}: {dt:.0f} s  [dim](demo so far {self.elapsed():.0f} s)[/dim]")

    def elapsed(self) -> float:
        return time.monotonic() - self._t0


def progress(console: Console) -> Progress:
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    )


def _steps_logged(metrics_jsonl: Path) -> int:
    """Training steps VERL's file logger has written so far (one JSON line per step)."""
    if not metrics_jsonl.is_file():
        return 0
    steps = 0
    for line in metrics_jsonl.read_text(errors="replace").splitlines():
        with contextlib.suppress(ValueError):
            rec: dict[str, Any] = json.loads(line)
            steps = max(steps, int(rec.get("step", 0)))
    return steps


def run_with_step_bar(
    console: Console, desc: str, total_steps: int, metrics_jsonl: Path, job: Callable[[], T], poll_s: float = 1.0
) -> T:
    """Run ``job`` (a training phase) with a bar fed by the steps VERL logs.

    The job runs in the calling thread, so Ctrl-C reaches the launcher, which ends its process group;
    a helper thread only reads the log and moves the bar.
    """
    stop = threading.Event()
    with progress(console) as bar:
        task = bar.add_task(f"{desc}: starting torchrun + VERL", total=total_steps)

        def poll() -> None:
            while not stop.wait(poll_s):
                done = _steps_logged(metrics_jsonl)
                label = "starting torchrun + VERL" if done == 0 else "steps"
                label = "saving + exporting to HF" if done >= total_steps else label
                bar.update(task, completed=min(done, total_steps), description=f"{desc}: {label}")

        poller = threading.Thread(target=poll, name=f"{desc} progress", daemon=True)
        poller.start()
        try:
            return job()
        finally:
            stop.set()
            poller.join()
            bar.update(task, completed=min(_steps_logged(metrics_jsonl), total_steps), description=f"{desc}: done")
