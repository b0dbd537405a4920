"""The update's batch splitting: VERL's per-sample selection against offsets and one gather
(trainer/in_verl/nested_batches.py).

``python -m bench nested-batches [--device cuda] [--samples 1024] [--mini 128] [--fields 17] [--repeats 3]`` builds a
step batch shaped like B1's at 64 x 16 (``samples`` sequences of ~290 tokens, ``fields`` packed nested fields as
VERL's update carries them) and times, in this process, the data path of VERL's update around the model: the mini
batches picked by a shuffled index (VERL's data loader hands a list of 0-d tensors), each split into two
length-balanced micro batches, the micro batches' log-probs joined and put back in order. VERL's functions
(``index_select_tensor_dict``, ``concat_nested_tensors``, ``restore_dynamic_batch``) against this project's, with
the device synchronised; PyTorch's profiler counts each path's ``aten::item`` and ``aten::unbind`` calls.
Writes ``bench/results/nested_batches[_DEVICE].{json,md}``.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from bench.common import header_md, md_table, run_record, write_result
from bench.torch_timing import timed_and_counted

SEQUENCE_LEN = (200, 380)  # prompt + response of B1's samples (~250 + ~35)


def step_batch(samples: int, fields: int, device: str, seed: int = 0) -> Any:
    """A TensorDict of ``fields`` packed nested fields (int64 and float32 alternately) and one plain field."""
    import torch
    from tensordict import TensorDict
    from verl.utils import tensordict_utils as tu

    rng = random.Random(seed)
    lengths = [rng.randint(*SEQUENCE_LEN) for _ in range(samples)]
    data: dict[str, Any] = {}
    for f in range(fields):
        dtype = torch.long if f % 2 == 0 else torch.float32
        data[f"field{f}"] = tu.nested_tensor_from_tensor_list(
            [torch.zeros(n, dtype=dtype, device=device) for n in lengths]
        )
    data["advantages"] = torch.zeros(samples, device=device)
    return TensorDict(data, batch_size=[samples])


def _functions(ours: bool) -> dict[str, Callable[..., Any]]:
    from verl.utils import seqlen_balancing as sb
    from verl.utils import tensordict_utils as tu

    from trainer.in_verl import nested_batches as nb
    from trainer.in_verl.import_hook import original

    if ours:
        return {"select": nb._index_select, "concat": nb._concat_nested, "restore": nb._restore_dynamic_batch}
    return {
        "select": original(tu, "index_select_tensor_dict"),
        "concat": original(tu, "concat_nested_tensors"),
        "restore": original(sb, "restore_dynamic_batch"),
    }


def mini_batch_indices(samples: int, mini: int, seed: int = 0) -> list[list[Any]]:
    """A shuffled order cut into mini batches, each a list of 0-d tensors as VERL's data loader hands them."""
    import torch

    order = torch.randperm(samples, generator=torch.Generator().manual_seed(seed))
    return [list(order[start : start + mini]) for start in range(0, samples, mini)]


def data_path(batch: Any, minis: list[list[Any]], fns: dict[str, Callable[..., Any]]) -> None:
    """Each mini batch selected, split into two micro batches, their first field joined and restored."""
    for indices in minis:
        mini_batch = fns["select"](batch, indices)
        half = list(range(len(mini_batch)))
        parts = [half[0::2], half[1::2]]
        micro = [fns["select"](mini_batch, p) for p in parts]
        joined = fns["concat"]([m["field1"] for m in micro])
        fns["restore"](joined, parts)


def _measure(batch: Any, mini: int, ours: bool, device: str, repeats: int) -> dict[str, Any]:
    fns, minis = _functions(ours), mini_batch_indices(len(batch), mini)
    return timed_and_counted(
        lambda: data_path(batch, minis, fns), device, repeats,
        {"item_calls": "aten::item", "unbind_calls": "aten::unbind"}, digits=4,
    )  # fmt: skip


def run(
    device: str = "cpu", samples: int = 1024, mini: int = 128, fields: int = 17, repeats: int = 3
) -> dict[str, Any]:
    if samples % mini:
        raise ValueError(f"--samples ({samples}) must be a multiple of --mini ({mini})")
    batch = step_batch(samples, fields, device)
    tokens = int(batch["field0"].offsets()[-1])
    rows = {path: _measure(batch, mini, path == "offsets", device, repeats) for path in ("verl", "offsets")}
    payload = {"benchmark": "nested_batches", "run": run_record(quick=False), "device": device, "samples": samples,
               "mini_batch": mini, "fields": fields, "tokens": tokens, "repeats": repeats, "rows": rows,
               "speedup": round(rows["verl"]["median_s"] / rows["offsets"]["median_s"], 2)}  # fmt: skip
    md = header_md("The update's batch splitting: VERL's per-sample selection against offsets", payload["run"])
    md += (f"A step batch of {samples} sequences ({tokens} tokens) with {fields} packed nested fields on `{device}`:"
           f" mini batches of {mini} by a shuffled index, two micro batches each, their log-probs joined and put"
           f" back in order; median of {repeats} after a warm-up.\n\n")  # fmt: skip
    md += md_table(
        ["path", "median s", "aten::item calls", "aten::unbind calls"],
        [[k, r["median_s"], r["item_calls"], r["unbind_calls"]] for k, r in rows.items()],
    )
    md += f"\nBy offsets: {payload['speedup']}x VERL's selection on this device.\n"
    name = "nested_batches" if device == "cpu" else f"nested_batches_{device.split(':')[0]}"
    write_result(name, payload, md, quick=False)
    return payload
