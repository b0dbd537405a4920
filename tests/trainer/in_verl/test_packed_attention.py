"""packed_sdpa: a packed row attends within each sequence exactly as sdpa does on the sequences one by one,
forward and backward; a padded batch with a 2D mask matches sdpa's padded result; the bounds of one row are
never reused for another; an exported config does not name the attention."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from trainer.in_verl import packed_attention
from trainer.in_verl.packed_attention import NAME, sequence_bounds

LENGTHS = (5, 9, 3)


def tiny_model(attn: str) -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=97, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, attn_implementation=attn,
    )  # fmt: skip
    return LlamaForCausalLM(config).eval()


def sequences() -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    return [torch.randint(0, 97, (n,), generator=gen) for n in LENGTHS]


def test_packed_row_equals_sequences_one_by_one_forward_and_backward() -> None:
    ref, packed = tiny_model("sdpa"), tiny_model(NAME)
    packed.load_state_dict(ref.state_dict())
    seqs = sequences()
    ref_logits = [ref(input_ids=s[None]).logits[0] for s in seqs]
    sum(x.float().pow(2).mean() for x in ref_logits).backward()  # type: ignore[union-attr]

    ids = torch.cat(seqs)[None]
    pos = torch.cat([torch.arange(n) for n in LENGTHS])[None]
    out = packed(input_ids=ids, position_ids=pos).logits[0]
    parts = list(out.split(list(LENGTHS)))
    sum(x.float().pow(2).mean() for x in parts).backward()  # type: ignore[union-attr]

    for got, want in zip(parts, ref_logits, strict=True):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    for (name, p_ref), (_, p_packed) in zip(ref.named_parameters(), packed.named_parameters(), strict=True):
        assert p_ref.grad is not None and p_packed.grad is not None, name
        torch.testing.assert_close(p_packed.grad, p_ref.grad, atol=1e-5, rtol=1e-4, msg=name)


def test_packed_row_differs_from_one_long_sequence() -> None:
    """The check above can fail: attending across the sequences (one causal row) gives other logits."""
    model = tiny_model(NAME)
    ids = torch.cat(sequences())[None]
    restarted = torch.cat([torch.arange(n) for n in LENGTHS])[None]
    with torch.no_grad():
        packed = model(input_ids=ids, position_ids=restarted).logits
        one_row = tiny_model("sdpa")
        one_row.load_state_dict(model.state_dict())
        whole = one_row(input_ids=ids, position_ids=torch.arange(ids.shape[1])[None]).logits
    assert not torch.allclose(packed[0, LENGTHS[0] :], whole[0, LENGTHS[0] :], atol=1e-3)


def test_padded_batch_with_mask_equals_sdpa() -> None:
    ref, padded = tiny_model("sdpa"), tiny_model(NAME)
    padded.load_state_dict(ref.state_dict())
    seqs = sequences()
    width = max(LENGTHS)
    ids = torch.zeros(len(seqs), width, dtype=torch.long)
    mask = torch.zeros(len(seqs), width, dtype=torch.long)
    for i, s in enumerate(seqs):  # left padding, as VERL's prompts
        ids[i, width - len(s) :], mask[i, width - len(s) :] = s, 1
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        want = ref(input_ids=ids, attention_mask=mask, position_ids=pos).logits
        got = padded(input_ids=ids, attention_mask=mask, position_ids=pos).logits
    keep = mask.bool()
    torch.testing.assert_close(got[keep], want[keep], atol=1e-5, rtol=1e-5)


def test_bounds_of_one_row_are_never_reused_for_another() -> None:
    first = torch.tensor([[0, 1, 2, 0, 1]])
    cu, longest = sequence_bounds(first)
    assert cu.tolist() == [0, 3, 5] and longest == 3
    assert sequence_bounds(first)[0] is cu  # the same row in the next layer: computed once
    del first
    second = torch.tensor([[0, 1, 0, 1, 2]])  # may take the freed tensor's memory
    cu2, longest2 = sequence_bounds(second)
    assert cu2.tolist() == [0, 2, 5] and longest2 == 3
    second.add_(0)  # changed in place: recomputed
    assert sequence_bounds(second)[0] is not cu2


def test_dropout_is_refused_by_name() -> None:
    q = torch.zeros(1, 2, 3, 4)
    with pytest.raises(ValueError, match=r"dropout 0\.1"):
        packed_attention.packed_sdpa_forward(torch.nn.Module(), q, q, q, None, dropout=0.1)


def test_exported_config_does_not_name_the_attention(tmp_path) -> None:  # type: ignore[no-untyped-def]
    tiny_model(NAME).save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert NAME not in json.dumps(saved)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="PyTorch's varlen kernel runs on CUDA only")
def test_varlen_kernel_equals_per_sequence_on_cuda() -> None:
    torch.manual_seed(0)
    total, cu = sum(LENGTHS), torch.tensor([0, 5, 14, 17], dtype=torch.int32, device="cuda")
    qkv = [torch.randn(1, 4, total, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3)]
    assert packed_attention.varlen_dtype(qkv[0]) == torch.bfloat16
    got = packed_attention._varlen(*qkv, cu, max(LENGTHS), None)
    grads_got = torch.autograd.grad(got.float().square().sum(), qkv)
    want = packed_attention._per_sequence(*qkv, cu, None)
    grads_want = torch.autograd.grad(want.float().square().sum(), qkv)
    torch.testing.assert_close(got, want, atol=2e-2, rtol=2e-2)
    for g, w in zip(grads_got, grads_want, strict=True):
        torch.testing.assert_close(g, w, atol=5e-2, rtol=5e-2)


def test_the_varlen_kernel_is_not_chosen_off_cuda_even_under_autocast() -> None:
    q = torch.zeros(1, 2, 3, 4)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert packed_attention.varlen_dtype(q) is None
    assert packed_attention.varlen_dtype(q.bfloat16()) is None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="PyTorch's varlen kernel runs on CUDA only")
def test_an_fp32_query_under_cuda_autocast_runs_in_autocasts_dtype() -> None:
    q = torch.zeros(1, 2, 3, 4, device="cuda")
    assert packed_attention.varlen_dtype(q) is None  # fp32 without autocast: per sequence
    with torch.autocast("cuda", dtype=torch.bfloat16):
        assert packed_attention.varlen_dtype(q) == torch.bfloat16
    assert packed_attention.varlen_dtype(q.half()) == torch.float16
