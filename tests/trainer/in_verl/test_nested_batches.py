"""Packed nested batches selected, chunked, joined and restored by offsets (trainer/in_verl/nested_batches.py),
against VERL's own functions: the same fields, values, offsets and non-tensor data; fields the gather cannot take
go through VERL's function; the patches land when VERL imports its modules."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch

from trainer.in_verl import nested_batches as nb
from trainer.in_verl.import_hook import original
from trainer.phases.launch import ALWAYS_LOADED

pytestmark = pytest.mark.verl
REPO = Path(__file__).resolve().parents[3]
LENGTHS = [3, 1, 5, 2, 4, 6, 1, 2]


def _tu() -> Any:
    from verl.utils import tensordict_utils as tu

    return tu


def _verl(name: str) -> Any:
    """VERL's function as it was before this module patched it."""
    module = _tu() if name != "restore_dynamic_batch" else sys.modules[nb.BALANCING_MODULE]
    return original(module, name)


def _batch(lengths: list[int] = LENGTHS) -> Any:
    from tensordict import NonTensorData, NonTensorStack, TensorDict

    tu = _tu()
    g = torch.Generator().manual_seed(0)
    ids = [torch.randint(0, 100, (n,), generator=g) for n in lengths]
    hidden = [torch.randn(n, 3, generator=g, dtype=torch.float64) for n in lengths]
    mrope = [torch.randint(0, 9, (4, n), generator=g) for n in lengths]  # ragged on dim 2: VERL's path
    b = len(lengths)
    return TensorDict(
        {
            "input_ids": tu.nested_tensor_from_tensor_list(ids),
            "hidden": tu.nested_tensor_from_tensor_list(hidden, ragged_idx=1),
            "mrope": tu.nested_tensor_from_tensor_list(mrope, ragged_idx=2),
            "advantages": torch.randn(b, generator=g),
            "uid": NonTensorStack(*[f"u{i}" for i in range(b)]),
            "temperature": NonTensorData(0.7),
        },
        batch_size=[b],
    )


def _assert_same(mine: Any, theirs: Any) -> None:
    assert set(mine.keys()) == set(theirs.keys())
    assert mine.batch_size == theirs.batch_size
    for key in list(theirs.keys()):
        a, b = mine[key], theirs[key]
        if isinstance(b, torch.Tensor) and b.is_nested:
            assert a.is_nested and getattr(a, "_ragged_idx", 1) == getattr(b, "_ragged_idx", 1), key
            assert torch.equal(a.offsets(), b.offsets()) and a.offsets().dtype == b.offsets().dtype, key
            assert torch.equal(a.values(), b.values()) and a.dtype == b.dtype and a.device == b.device, key
        elif isinstance(b, torch.Tensor):
            assert torch.equal(a, b), key
        else:
            assert a == b, key


@pytest.mark.parametrize(
    "indices",
    [[5, 0, 7, 2], list(range(8)), [3], [6, 6, 1], [-1, 0]],
    ids=["shuffled", "all", "one", "repeated", "negative"],
)
def test_index_select_equals_verls(indices: list[int]) -> None:
    batch = _batch()
    assert _verl("index_select_tensor_dict").__module__ == "verl.utils.tensordict_utils"  # VERL's, not ours
    for form in (indices, torch.tensor(indices), [torch.tensor(i) for i in indices]):
        _assert_same(nb._index_select(batch, form), _verl("index_select_tensor_dict")(batch, torch.tensor(indices)))


def test_select_rows_gathers_each_sample_whole() -> None:
    nt = torch.nested.as_nested_tensor([torch.arange(n) + 10 * i for i, n in enumerate(LENGTHS)], layout=torch.jagged)
    out = nb.select_rows(nt, [2, 0])
    assert [t.tolist() for t in out.unbind()] == [[20, 21, 22, 23, 24], [0, 1, 2]]
    assert out.offsets().tolist() == [0, 5, 8]


def test_chunks_equal_verls() -> None:
    batch = _batch()
    for chunks in (1, 2, 4):
        mine, theirs = nb._chunk(batch, chunks), _verl("chunk_tensordict")(batch, chunks)
        assert len(mine) == len(theirs) == chunks
        for a, b in zip(mine, theirs, strict=True):
            _assert_same(a, b)


def test_concat_equals_verls() -> None:
    tu = _tu()
    parts = [
        tu.nested_tensor_from_tensor_list([torch.arange(n, dtype=torch.float32) for n in lengths])
        for lengths in ([2, 3], [1], [4, 1, 2])
    ]
    mine, theirs = nb._concat_nested(parts), _verl("concat_nested_tensors")(parts)
    assert torch.equal(mine.offsets(), theirs.offsets()) and torch.equal(mine.values(), theirs.values())
    assert mine.offsets().tolist() == [0, 2, 5, 6, 10, 11, 13]


def test_restore_dynamic_batch_equals_verls() -> None:
    import verl.utils.seqlen_balancing  # noqa: F401

    partitions = [[4, 0, 6], [1, 7], [3, 5, 2]]
    flat = [i for p in partitions for i in p]
    nt = nb.select_rows(_batch()["input_ids"], flat)  # the micro batches' outputs, in their order
    mine, theirs = nb._restore_dynamic_batch(nt, partitions), _verl("restore_dynamic_batch")(nt, partitions)
    assert torch.equal(mine.offsets(), theirs.offsets()) and torch.equal(mine.values(), theirs.values())
    assert torch.equal(mine.values(), _batch()["input_ids"].values())  # back in the mini batch's order


def test_gradients_flow_through_a_selection() -> None:
    values = torch.randn(sum(LENGTHS), dtype=torch.float64, requires_grad=True)
    offsets = torch.tensor([0, *torch.tensor(LENGTHS).cumsum(0).tolist()])
    nt = torch.nested.nested_tensor_from_jagged(values, offsets)
    (nb.select_rows(nt, [1, 1, 4]).values() * 2).sum().backward()
    expected = torch.zeros_like(values)
    expected[3] = 4.0  # sample 1 (one token) picked twice
    expected[11:15] = 2.0  # sample 4
    assert values.grad is not None and torch.equal(values.grad, expected)


def test_bad_indices_are_errors_that_say_why() -> None:
    nt = _batch()["input_ids"]
    with pytest.raises(IndexError, match="outside the 8 samples"):
        nb.select_rows(nt, [8])
    with pytest.raises(ValueError, match="must be 1-D"):
        nb.select_rows(nt, torch.zeros(2, 2, dtype=torch.long))
    with pytest.raises(ValueError, match="ragged on dim 1"):
        nb.select_rows(_batch()["mrope"], [0])
    with pytest.raises(ValueError, match="8 samples do not split into 3 equal chunks"):
        nb.split_rows(nt, 3)
    assert not nb.packed(torch.zeros(3)) and nb.packed(nt)


def test_the_patches_land_when_verl_imports_its_modules() -> None:
    assert nb.MODULE in ALWAYS_LOADED
    code = f"""
        import os, sys
        os.environ["VERL_USE_EXTERNAL_MODULES"] = "{nb.MODULE}"
        import verl
        import verl.utils.tensordict_utils as tu
        import verl.workers.engine.utils as engine_utils
        from trainer.in_verl import nested_batches as nb
        assert tu.index_select_tensor_dict is nb._index_select
        assert tu.chunk_tensordict is nb._chunk and tu.concat_nested_tensors is nb._concat_nested
        assert engine_utils.restore_dynamic_batch is nb._restore_dynamic_batch
        from trainer.in_verl.import_hook import original
        assert original(tu, "index_select_tensor_dict").__module__ == "verl.utils.tensordict_utils"
        print("patched")
    """
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=REPO, capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "patched" in done.stdout
