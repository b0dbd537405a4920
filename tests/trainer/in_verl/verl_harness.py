"""Drive VERL 0.9's own reward path in-process: its Hydra config, a rollout-shaped DataProto and
``RewardLoopWorker.compute_score_batch`` (docs/notes/verl-0.9.md)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[3]
REWARD_FN = REPO / "trainer" / "in_verl" / "reward_fn.py"


def compose_ppo_config(model_dir: Path, overrides: Sequence[str] = ()) -> Any:
    """``ppo_trainer`` composed from VERL's own config folder, with our overrides."""
    import verl
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    config_dir = Path(verl.__file__).parent / "trainer" / "config"
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(config_dir), version_base=None):
        return compose("ppo_trainer", overrides=[f"actor_rollout_ref.model.path={model_dir}", *overrides])


def reward_overrides(url: str, **kwargs: Any) -> list[str]:
    """The exact ``reward.*`` overrides docs/trainer.md documents."""
    out = [f"reward.custom_reward_function.path={REWARD_FN}", "reward.custom_reward_function.name=compute_score"]
    out.append(f"+reward.custom_reward_function.reward_kwargs.url={url}")
    out += [f"+reward.custom_reward_function.reward_kwargs.{k}={v}" for k, v in kwargs.items()]
    return out


def rollout_dataproto(
    tokenizer: Any, samples: Sequence[dict[str, Any]], prompt_len: int = 512, resp_len: int = 256
) -> Any:
    """A DataProto shaped like rollout output: left-padded prompts, right-padded responses.

    Each sample: ``prompt`` (messages), ``response`` (text), ``data_source``, ``ground_truth``
    (JSON string, as in our parquet) and ``extra_info``.
    """
    import torch
    from verl import DataProto

    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    prompts, responses, masks = [], [], []
    for s in samples:
        p_ids = tokenizer.apply_chat_template(s["prompt"], add_generation_prompt=True, tokenize=True)
        if not isinstance(p_ids, list):  # transformers 5 may return a BatchEncoding
            p_ids = list(p_ids["input_ids"])
        p_ids = p_ids[-prompt_len:]
        r_ids = [*tokenizer(s["response"], add_special_tokens=False)["input_ids"], tokenizer.eos_token_id]
        if len(r_ids) > resp_len:  # silent truncation would change the expected score
            raise ValueError(f"response of {len(r_ids)} tokens exceeds resp_len={resp_len}")
        p_pad = prompt_len - len(p_ids)
        r_pad = resp_len - len(r_ids)
        prompts.append([pad] * p_pad + p_ids)
        responses.append(r_ids + [pad] * r_pad)
        masks.append([0] * p_pad + [1] * len(p_ids) + [1] * len(r_ids) + [0] * r_pad)
    prompt_t = torch.tensor(prompts)
    resp_t = torch.tensor(responses)
    attn = torch.tensor(masks)
    position_ids = torch.clamp(torch.cumsum(attn, dim=1) - 1, min=0)
    batch = {
        "prompts": prompt_t,
        "responses": resp_t,
        "input_ids": torch.cat([prompt_t, resp_t], dim=1),
        "attention_mask": attn,
        "position_ids": position_ids,
    }
    non_tensors = {
        "data_source": np.array([s["data_source"] for s in samples], dtype=object),
        "reward_model": np.array(
            [{"style": "rule", "ground_truth": s["ground_truth"]} for s in samples], dtype=object
        ),
        "extra_info": np.array([dict(s.get("extra_info", {})) for s in samples], dtype=object),
    }
    return DataProto.from_dict(tensors=batch, non_tensors=non_tensors)


def run_reward_worker(cfg: Any, data: Any) -> list[dict[str, Any]]:
    """VERL's production worker class, on its own event loop (as in a RewardLoopWorker actor)."""
    from verl.experimental.reward_loop import RewardLoopWorker

    worker = RewardLoopWorker(cfg)
    out: list[dict[str, Any]] = worker.loop.run_until_complete(worker.compute_score_batch(data))
    return out


def gt_json(obj: dict[str, Any]) -> str:
    return json.dumps(obj)
