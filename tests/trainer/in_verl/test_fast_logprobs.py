"""trainer.in_verl.fast_logprobs: VERL's token log-probabilities without its per-row Python loop.

Checked against VERL 0.9.1's own ``logprobs_from_logits_v2`` (values and gradients, fp32 and bf16,
2-D unpadded and 3-D padded logits, blocks that do not divide the rows), and that every VERL process
of a phase loads it through ``VERL_USE_EXTERNAL_MODULES``, on both profiles.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("verl")

from trainer.in_verl import fast_logprobs  # noqa: E402
from trainer.phases.launch import (  # noqa: E402
    AGENT_LOOP_SPEED,
    FAST_LOGPROBS,
    NESTED_BATCHES,
    PACKED_ATTENTION,
    RESPONSE_PADDING,
    PhaseRun,
    external_modules,
)

ALWAYS = f"{FAST_LOGPROBS},{PACKED_ATTENTION},{AGENT_LOOP_SPEED},{RESPONSE_PADDING},{NESTED_BATCHES}"
from trainer.registry.phases import get_phase  # noqa: E402

REPO = Path(__file__).resolve().parents[3]


def verl_v2():  # type: ignore[no-untyped-def]
    return fast_logprobs.original()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(37,), (3, 11)])
@pytest.mark.parametrize("block_elements", [fast_logprobs.BLOCK_ELEMENTS, 5 * 97])
def test_values_and_gradients_equal_verls(dtype: torch.dtype, shape: tuple[int, ...], block_elements: int) -> None:
    vocab = 97
    gen = torch.Generator().manual_seed(7)
    base = (torch.randn(*shape, vocab, generator=gen) * 4).to(dtype)
    labels = torch.randint(0, vocab, shape, generator=gen)
    ours_in = base.clone().requires_grad_(True)
    theirs_in = base.clone().requires_grad_(True)

    ours = fast_logprobs.logprobs_by_row_blocks(ours_in, labels, block_elements=block_elements)
    theirs = verl_v2()(theirs_in, labels)  # type: ignore[operator]
    assert ours.shape == theirs.shape == labels.shape and ours.dtype == theirs.dtype
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(ours.float(), theirs.float(), rtol=tol, atol=tol)

    weights = torch.randn(shape, generator=gen).to(dtype)
    (ours * weights).sum().backward()
    (theirs * weights).sum().backward()
    assert ours_in.grad is not None and theirs_in.grad is not None
    torch.testing.assert_close(ours_in.grad.float(), theirs_in.grad.float(), rtol=tol, atol=tol)


def test_blocks_bound_the_rows_per_step() -> None:
    logits = torch.randn(10, 8)
    labels = torch.randint(0, 8, (10,))
    # 3 rows per block: 4 blocks; same answer as one block
    small = fast_logprobs.logprobs_by_row_blocks(logits, labels, block_elements=24)
    whole = fast_logprobs.logprobs_by_row_blocks(logits, labels)
    torch.testing.assert_close(small, whole)
    expected = torch.log_softmax(logits, -1).gather(-1, labels[:, None]).squeeze(-1)
    torch.testing.assert_close(whole, expected)


def test_empty_and_bad_shapes() -> None:
    out = fast_logprobs.logprobs_by_row_blocks(torch.randn(0, 5), torch.zeros(0, dtype=torch.long))
    assert out.shape == (0,)
    with pytest.raises(ValueError, match="labels shape"):
        fast_logprobs.logprobs_by_row_blocks(torch.randn(4, 5), torch.zeros(3, dtype=torch.long))


def test_verls_entry_point_uses_it_after_install() -> None:
    import verl.utils.torch_functional as tf

    fast_logprobs.install()
    fast_logprobs.install()  # idempotent: the original stays VERL's
    assert fast_logprobs.installed()
    assert tf.logprobs_from_logits_v2 is fast_logprobs.logprobs_by_row_blocks
    assert getattr(verl_v2(), "__module__", "") == "verl.utils.torch_functional"


@pytest.mark.parametrize(
    ("profile", "inherited", "expected"),
    [
        ("gpu", "", ALWAYS),
        ("gpu", "trainer.in_verl.cpu_shim", ALWAYS),
        ("gpu", "my_plugin, trainer.in_verl.fast_logprobs", f"my_plugin,{ALWAYS}"),
        ("cpu-smoke", "", f"trainer.in_verl.cpu_shim,{ALWAYS}"),
        ("cpu-smoke", "my_plugin", f"trainer.in_verl.cpu_shim,my_plugin,{ALWAYS}"),
    ],
)
def test_external_modules(profile: str, inherited: str, expected: str) -> None:
    assert external_modules(profile, inherited) == expected  # type: ignore[arg-type]


def test_speedups_are_left_out_by_name_and_an_unknown_name_is_refused() -> None:
    got = external_modules("gpu", "", "nested_batches, response_padding")
    assert got == f"{FAST_LOGPROBS},{PACKED_ATTENTION},{AGENT_LOOP_SPEED}"
    assert external_modules("gpu", "", "nested_batches").split(",")[-1] == RESPONSE_PADDING
    with pytest.raises(ValueError, match=r"TRAINER_SPEEDUPS_OFF: unknown \['fast_logprobs'\]"):
        external_modules("gpu", "", "fast_logprobs")


@pytest.mark.verl
@pytest.mark.parametrize("profile", ["gpu", "cpu-smoke"])
def test_every_verl_process_of_a_phase_loads_it(profile: str) -> None:
    """``import verl`` alone, in a fresh process with the phase's environment, installs the patch."""
    env = PhaseRun(get_phase("a1"), profile, Path("d"), Path("o"), "m").env(dict(os.environ))  # type: ignore[arg-type]
    code = (
        "import json, verl, verl.utils.torch_functional as tf, sys\n"
        "print(json.dumps({'module': tf.logprobs_from_logits_v2.__module__,"
        " 'shim': 'trainer.in_verl.cpu_shim' in sys.modules,"
        " 'packed': 'packed_sdpa' in __import__('transformers').AttentionInterface._global_mapping}))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=REPO, capture_output=True, text=True, timeout=300, check=False
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result == {"module": FAST_LOGPROBS, "shim": profile == "cpu-smoke", "packed": True}
