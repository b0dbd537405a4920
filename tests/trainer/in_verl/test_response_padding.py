"""The update loss's response slicing in one gather (trainer/in_verl/response_padding.py), against VERL's own
``no_padding_2_padding``: the same values and gradients on nested and padded batches, its checks kept, and the
patch landing when VERL's loss module is imported and not before."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch

from trainer.in_verl import response_padding as rp
from trainer.phases.launch import ALWAYS_LOADED

pytestmark = pytest.mark.verl
REPO = Path(__file__).resolve().parents[3]


def _nested_batch(prompts: list[int], responses: list[int], max_len: int | None = None) -> object:
    from tensordict import TensorDict
    from verl.utils import tensordict_utils as tu

    def nested(lengths: list[int]) -> torch.Tensor:
        return torch.nested.as_nested_tensor([torch.ones(n, dtype=torch.long) for n in lengths], layout=torch.jagged)

    data = TensorDict({"prompts": nested(prompts), "responses": nested(responses)}, batch_size=[len(prompts)])
    if max_len is not None:
        tu.assign_non_tensor_data(data, "max_response_len", max_len)
    return data


def _padded_batch(prompts: list[int], responses: list[int], p_width: int, r_width: int) -> object:
    from tensordict import TensorDict

    b = len(prompts)
    mask = torch.zeros(b, p_width + r_width, dtype=torch.long)
    for i, (p, r) in enumerate(zip(prompts, responses, strict=True)):
        mask[i, p_width - p : p_width] = 1  # left-padded prompt
        mask[i, p_width : p_width + r] = 1
    return TensorDict({"prompts": torch.zeros(b, p_width, dtype=torch.long),
                       "responses": torch.zeros(b, r_width, dtype=torch.long), "attention_mask": mask},
                      batch_size=[b])  # fmt: skip


def _verl() -> Any:
    from verl.workers.utils.padding import no_padding_2_padding

    return no_padding_2_padding


@pytest.mark.parametrize(("max_len", "trailing"), [(None, ()), (9, ()), (4, ()), (None, (3,))])
def test_values_and_gradients_equal_verls_on_a_nested_batch(max_len: int | None, trailing: tuple[int, ...]) -> None:
    prompts, responses = [3, 1, 5, 2], [4, 6, 1, 5]
    data = _nested_batch(prompts, responses, max_len)
    total = sum(prompts) + sum(responses)
    torch.manual_seed(0)
    base = torch.randn(total, *trailing, dtype=torch.float64)
    mine_in, verl_in = base.clone().requires_grad_(), base.clone().requires_grad_()
    mine, theirs = rp.responses_padded(mine_in, data), _verl()(verl_in, data)
    assert mine.shape == theirs.shape and torch.equal(mine, theirs)
    weights = torch.randn_like(mine)
    (mine * weights).sum().backward()  # type: ignore[no-untyped-call]
    (theirs * weights).sum().backward()
    assert mine_in.grad is not None and verl_in.grad is not None
    assert torch.equal(mine_in.grad, verl_in.grad)


def test_a_padded_batch_reads_its_lengths_from_the_attention_mask() -> None:
    prompts, responses = [2, 4, 1], [3, 1, 4]
    data = _padded_batch(prompts, responses, p_width=4, r_width=5)
    values = torch.arange(sum(prompts) + sum(responses), dtype=torch.float32)
    out = rp.responses_padded(values, data)
    assert torch.equal(out, _verl()(values, data)) and out.shape == (3, 5)
    # sample 1: prompt of 4 at offsets 5..8, its response's first log-prob is the output at the prompt's last token
    assert out[1].tolist() == [8.0, 0.0, 0.0, 0.0, 0.0]


def test_a_packed_length_that_does_not_add_up_and_an_empty_prompt_are_errors() -> None:
    data = _nested_batch([2, 3], [1, 2])
    with pytest.raises(ValueError, match="hold 8 tokens, the packed output 7"):
        rp.responses_padded(torch.zeros(7), data)
    with pytest.raises(ValueError, match="an empty prompt"):
        rp.responses_padded(torch.zeros(5), _padded_batch([0, 2], [1, 2], 2, 2))


def test_the_patch_lands_when_verl_imports_its_loss_module_and_not_before() -> None:
    assert rp.MODULE in ALWAYS_LOADED
    code = f"""
        import os, sys
        os.environ["VERL_USE_EXTERNAL_MODULES"] = "{rp.MODULE}"
        import verl
        assert "{rp.LOSSES_MODULE}" not in sys.modules, "imported eagerly"
        import verl.workers.utils.losses as losses
        from trainer.in_verl.response_padding import responses_padded
        assert losses.no_padding_2_padding is responses_padded
        print("patched")
    """
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=REPO, capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "patched" in done.stdout
