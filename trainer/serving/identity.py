"""Which model is this, and which model does that URL serve? Content fingerprints of model folders,
and the check that an external URL serves the model a loop step expects.

A path names a model only on the machine that wrote it, and a loop step's model may have been
trained minutes earlier; so identity is the content: :func:`fingerprint` hashes every file of the
model folder (weights, config, tokenizer). An external server proves it serves that model through
its OpenAI ``/v1/models`` list: an entry whose ``root`` is the same folder, or whose served name
carries the fingerprint's first :data:`SHORT` hex digits (``vllm serve DIR --served-model-name
pi1-pipe-<hash>``). A reward API proves it through ``/info``'s executor model name (it never shows
URLs). Anything else stops the loop with a message that says what was served and what was expected.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import httpx

from trainer.serving.reward_api_env import env_name

SHORT = 12
_CHUNK = 1 << 20


class ServedModelMismatch(RuntimeError):
    """An external URL does not serve the model this loop step expects."""


def _files(model_dir: Path) -> tuple[tuple[str, int, int], ...]:
    out = []
    for root, dirs, files in os.walk(model_dir):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(files):
            if name.startswith("."):
                continue
            p = Path(root) / name
            st = p.stat()
            out.append((str(p.relative_to(model_dir)), st.st_size, st.st_mtime_ns))
    return tuple(sorted(out))


@lru_cache(maxsize=64)
def _fingerprint(model_dir: str, listing: tuple[tuple[str, int, int], ...]) -> str:
    h = hashlib.sha256()
    for rel, size, _mtime in listing:
        h.update(f"{rel}\0{size}\0".encode())
        with (Path(model_dir) / rel).open("rb") as fh:
            while chunk := fh.read(_CHUNK):
                h.update(chunk)
    return h.hexdigest()


def fingerprint(model: str | Path) -> str:
    """sha256 over the relative names and contents of every (non-hidden) file of a model folder.

    Cached per process while no file's size or mtime changes. A ``model`` that is not a local
    folder (a name resolved elsewhere) fingerprints as ``name:<model>``.
    """
    p = Path(model)
    if not p.is_dir():
        return f"name:{model}"
    real = p.resolve()
    return _fingerprint(str(real), _files(real))


def short(fp: str) -> str:
    return fp.removeprefix("name:")[:SHORT]


@dataclass(frozen=True)
class ServedModel:
    """What an external URL served, as recorded in the loop manifest."""

    url: str
    served_name: str
    root: str | None
    matched_by: str
    expected_model: str
    expected_fingerprint: str

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _base(url: str) -> str:
    return url.rstrip("/").removesuffix("/v1")


def _same_folder(root: str | None, expected: Path) -> bool:
    if not root:
        return False
    try:
        return Path(root).resolve() == expected.resolve()
    except OSError:
        return False


def check_executor_url(url: str, expected_model: str, what: str, timeout_s: float = 30.0) -> ServedModel:
    """``url``'s ``/v1/models`` must list ``expected_model`` (same folder, or its hash in the name)."""
    fp = fingerprint(expected_model)
    try:
        resp = httpx.get(f"{_base(url)}/v1/models", timeout=timeout_s)
        resp.raise_for_status()
        entries = resp.json()["data"]
    except (httpx.HTTPError, KeyError, ValueError) as exc:
        raise ServedModelMismatch(f"{what}: cannot list the models of {url} (/v1/models): {exc}") from exc
    for e in entries:
        name, root = str(e.get("id")), e.get("root")
        if _same_folder(root, Path(expected_model)):
            return ServedModel(url, name, root, "root", expected_model, fp)
        if short(fp) in name:
            return ServedModel(url, name, root, "served name carries the fingerprint", expected_model, fp)
    served = [f"{e.get('id')} (root {e.get('root')})" for e in entries]
    raise ServedModelMismatch(
        f"{what}: {url} serves {served}, but this step expects {expected_model} (fingerprint {short(fp)}). "
        f"Serve that folder there, e.g. `vllm serve {expected_model} --served-model-name <name>-{short(fp)}`, "
        "or drop the URL and let the loop serve it locally."
    )


def check_reward_api_url(
    url: str, expected_model: str, what: str, token: str | None = None, timeout_s: float = 30.0
) -> ServedModel:
    """A reward API's executor must serve ``expected_model``: ``/info``'s executor model name carries its hash."""
    fp = fingerprint(expected_model)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        resp = httpx.get(f"{url.rstrip('/')}/info", headers=headers, timeout=timeout_s)
        resp.raise_for_status()
        executor = resp.json()["executor"]
    except (httpx.HTTPError, KeyError, ValueError) as exc:
        raise ServedModelMismatch(f"{what}: cannot read {url}/info: {exc}") from exc
    name = str(executor.get("model"))
    if not executor.get("configured"):
        raise ServedModelMismatch(f"{what}: the reward API at {url} has no executor, but this step needs one")
    if short(fp) in name:
        return ServedModel(url, name, None, "executor model name carries the fingerprint", expected_model, fp)
    raise ServedModelMismatch(
        f"{what}: the reward API at {url} sends its executor calls to model {name!r}, but this step expects "
        f"{expected_model} (fingerprint {short(fp)}). Serve that folder with "
        f"`--served-model-name <name>-{short(fp)}` and set {env_name('executor_model')} to that name."
    )
