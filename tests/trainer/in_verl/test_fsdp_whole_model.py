"""FSDP2 around the policy as one unit (trainer/in_verl/fsdp_whole_model.py): with the config key, only the root is
an FSDP unit and the gradients equal those of VERL's per-layer wrap (a tied-embedding Llama, one gloo process);
without it VERL's function runs; the patch lands when VERL imports its FSDP helpers."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from trainer.in_verl import fsdp_whole_model as fw
from trainer.phases.launch import ALWAYS_LOADED

pytestmark = pytest.mark.verl
REPO = Path(__file__).resolve().parents[3]


def _python(code: str) -> str:
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=REPO, capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_one_unit_gives_the_per_layer_wraps_gradients() -> None:
    out = _python(
        """
        import os, socket, torch, torch.distributed as dist
        s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("gloo", rank=0, world_size=1)
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import FSDPModule
        from transformers import LlamaConfig, LlamaForCausalLM
        import verl.utils.fsdp_utils as fu
        from trainer.in_verl import fsdp_whole_model as fw
        cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                          num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
        mesh = init_device_mesh("cpu", (1,))
        x = torch.randint(0, 64, (2, 7), generator=torch.Generator().manual_seed(1))
        grads, units = {}, {}
        for name, policy in (("layers", {}), ("whole", {"whole_model": True})):
            torch.manual_seed(0)
            m = LlamaForCausalLM(cfg)
            fu.apply_fsdp2(m, {"mesh": mesh}, {"wrap_policy": policy})
            units[name] = sum(isinstance(mod, FSDPModule) for mod in m.modules())
            m(input_ids=x).logits.float().pow(2).mean().backward()
            grads[name] = {n: p.grad.full_tensor() for n, p in m.named_parameters()}
        same = all(torch.allclose(grads["layers"][n], g, rtol=1e-5, atol=1e-7) for n, g in grads["whole"].items())
        print("units", units["layers"], units["whole"], "same", same, "params", len(grads["whole"]))
        dist.destroy_process_group()
        """
    )
    assert "units 4 1 same True" in out, out  # 3 layers + the root, against the root alone


def test_the_key_is_read_strictly() -> None:
    assert fw.whole_model_wanted({"wrap_policy": {"whole_model": True}})
    assert not fw.whole_model_wanted({"wrap_policy": {}}) and not fw.whole_model_wanted({})
    with pytest.raises(ValueError, match=r"wrap_policy.whole_model must be true or false, got 'yes'"):
        fw.whole_model_wanted({"wrap_policy": {"whole_model": "yes"}})


def test_the_patch_lands_before_verls_fsdp_engine_binds_it() -> None:
    assert fw.MODULE in ALWAYS_LOADED
    out = _python(
        f"""
        import os
        os.environ["VERL_USE_EXTERNAL_MODULES"] = "{fw.MODULE}"
        import verl
        import verl.workers.engine.fsdp.transformer_impl as impl
        from trainer.in_verl import fsdp_whole_model as fw
        assert impl.apply_fsdp2 is fw._apply_fsdp2
        print("patched")
        """
    )
    assert "patched" in out
