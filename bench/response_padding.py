"""The update loss's response slicing: VERL's per-sample loop against one gather (trainer/in_verl/response_padding.py).

``python -m bench response-padding [--device cuda] [--samples 128] [--repeats 5]`` builds a micro batch shaped like
B1's at 64 x 16 (a mini batch of 128 samples; prompts and responses drawn around the lengths B1's steps logged,
~250 and ~35 tokens), then times, in this process, VERL's ``no_padding_2_padding`` and :func:`responses_padded` on
its packed log-probs and entropy: forward, a weighted sum, backward, with the device synchronised. PyTorch's
profiler counts each one's ``aten::item`` calls (on a GPU each one waits for the device) and its operators.
Writes ``bench/results/response_padding[_DEVICE].{json,md}``.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from bench.common import header_md, md_table, run_record, write_result
from bench.torch_timing import timed_and_counted

PROMPT_LEN = (180, 320)  # uniform range: B1's prompts (prompt_length/mean ~250)
RESPONSE_LEN = (15, 60)  # B1's responses (response_length/mean ~35)


def micro_batch(samples: int, device: str, seed: int = 0) -> tuple[Any, int]:
    """A nested micro batch (prompts, responses, max_response_len) and its packed token count."""
    import torch
    from tensordict import TensorDict
    from verl.utils import tensordict_utils as tu

    rng = random.Random(seed)
    prompts = [rng.randint(*PROMPT_LEN) for _ in range(samples)]
    responses = [rng.randint(*RESPONSE_LEN) for _ in range(samples)]

    def nested(lengths: list[int]) -> Any:
        return torch.nested.as_nested_tensor(
            [torch.ones(n, dtype=torch.long, device=device) for n in lengths], layout=torch.jagged
        )

    data = TensorDict({"prompts": nested(prompts), "responses": nested(responses)}, batch_size=[samples])
    tu.assign_non_tensor_data(data, "max_response_len", max(responses))
    return data, sum(prompts) + sum(responses)


def _measure(fn: Callable[[Any, Any], Any], data: Any, tokens: int, device: str, repeats: int) -> dict[str, Any]:
    import torch

    def work() -> None:
        logp = torch.randn(tokens, device=device, requires_grad=True)
        ent = torch.randn(tokens, device=device, requires_grad=True)
        out = fn(logp, data) * 0.5 + fn(ent, data) * 0.01
        out.sum().backward()

    counted = {"item_calls": "aten::item", "slice_calls": "aten::slice", "pad_calls": "aten::pad"}
    return timed_and_counted(work, device, repeats, counted)


def run(device: str = "cpu", samples: int = 128, repeats: int = 5) -> dict[str, Any]:
    from verl.workers.utils.padding import no_padding_2_padding

    from trainer.in_verl.response_padding import responses_padded

    data, tokens = micro_batch(samples, device)
    rows = {
        "verl_loop": _measure(no_padding_2_padding, data, tokens, device, repeats),
        "one_gather": _measure(responses_padded, data, tokens, device, repeats),
    }
    payload = {"benchmark": "response_padding", "run": run_record(quick=False), "device": device,
               "samples": samples, "tokens": tokens, "repeats": repeats, "rows": rows,
               "speedup": round(rows["verl_loop"]["median_s"] / rows["one_gather"]["median_s"], 2)}  # fmt: skip
    md = header_md("The update loss's response slicing: VERL's loop against one gather", payload["run"])
    md += (f"A micro batch of {samples} samples, {tokens} packed tokens, on `{device}`: log-probs and entropy sliced"
           f" into padded responses, a weighted sum, backward; median of {repeats} after a warm-up.\n\n")  # fmt: skip
    md += md_table(
        ["path", "median s", "aten::item calls", "aten::slice calls", "aten::pad calls"],
        [[k, r["median_s"], r["item_calls"], r["slice_calls"], r["pad_calls"]] for k, r in rows.items()],
    )
    md += f"\nOne gather: {payload['speedup']}x VERL's loop on this device.\n"
    name = "response_padding" if device == "cpu" else f"response_padding_{device.split(':')[0]}"
    write_result(name, payload, md, quick=False)
    return payload
