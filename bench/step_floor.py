"""What a GRPO step's two large parts cost without VERL around them, on the same card, model and prompts.

A B1 step on one H200 spends ~7.7 s generating and ~6.8 s updating the actor while the card is busy 17% of the
phase (bench/results/rl_step_rollout_path.md). This measures the same work done directly, so that each part's
gap to VERL's is known before it is worked on:

- ``gen``: vLLM's offline engine (``vllm.LLM``) generates ``n`` samples for each of ``prompts`` prompts of a
  phase's train parquet, with the gpu profile's engine settings (bf16, decode CUDA graphs without torch.compile,
  prefix caching, the sampled token's log-prob), at a given ``max_num_seqs`` / ``max_num_batched_tokens``. It
  writes the responses' token ids for ``update``.
- ``update``: the policy in bf16 autocast over fp32 weights, with the phase's attention (``packed_sdpa``:
  padding-free rows, trainer/in_verl/packed_attention.py), on mini batches of those prompt + response
  sequences packed up to ``max_tokens`` a micro batch: forward, log-probs of the response tokens (our row-block
  log-probs), entropy, a token-mean policy-gradient loss, backward, an AdamW step. It reports seconds per mini
  batch and PyTorch's profiler top operators for one of them.

Each command appends one JSON line to ``--out``; ``report`` turns the lines into bench/results/NAME.{json,md}.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.common import md_table, run_record, write_result

NAME = "step_floor"
# The gpu profile's scheduler sizes (trainer/phases/configs/profile/gpu.yaml; VERL 0.9.1's own are 256 / 8,192)
PROFILE_MAX_NUM_SEQS, PROFILE_MAX_BATCHED_TOKENS = 1024, 32768


def b1_work() -> dict[str, int]:
    """A B1 step's sizes in the gpu profile (trainer/phases/configs/profile/gpu.yaml) and B1's answer budget:
    prompts and samples per prompt, samples per mini batch, tokens per micro batch, response tokens."""
    from omegaconf import OmegaConf

    from trainer.phases.launch import CONFIG_DIR
    from trainer.registry.phases import get_phase

    gpu = OmegaConf.load(CONFIG_DIR / "profile" / "gpu.yaml")
    n = int(gpu.actor_rollout_ref.rollout.n)
    return {
        "prompts": int(gpu.data.train_batch_size), "n": n,
        "mini_batch": int(gpu.actor_rollout_ref.actor.ppo_mini_batch_size) * n,
        "micro_tokens": int(gpu.actor_rollout_ref.actor.ppo_max_token_len_per_gpu),
        "max_tokens": int(get_phase("b1").max_response_length or 0),
    }  # fmt: skip


def _prompts(parquet: Path, tokenizer: Any, count: int) -> list[list[int]]:
    import pandas as pd

    rows = pd.read_parquet(parquet, columns=["prompt"]).head(count)["prompt"]
    out: list[list[int]] = []
    for messages in rows:
        ids = tokenizer.apply_chat_template(list(messages), add_generation_prompt=True, tokenize=True)
        out.append(list(ids["input_ids"]) if not isinstance(ids, list) else ids)
    if len(out) < count:
        raise ValueError(f"{parquet}: {len(out)} prompts, {count} asked (--prompts)")
    return out


def measure_gen(
    model: Path, parquet: Path, out: Path, *, prompts: int | None = None, n: int | None = None,
    max_tokens: int | None = None, max_num_seqs: int = PROFILE_MAX_NUM_SEQS,
    max_num_batched_tokens: int = PROFILE_MAX_BATCHED_TOKENS, gpu_memory_utilization: float = 0.5, graphs: bool = True,
) -> dict[str, Any]:  # fmt: skip
    """``prompts``, ``n``, ``max_tokens``: None takes :func:`b1_work`'s."""
    from transformers import AutoTokenizer
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    work = b1_work()
    prompts, n, max_tokens = prompts or work["prompts"], n or work["n"], max_tokens or work["max_tokens"]
    ids = _prompts(parquet, AutoTokenizer.from_pretrained(model), prompts)
    t0 = time.perf_counter()
    engine_args: dict[str, Any] = {"enforce_eager": not graphs}
    if graphs:
        engine_args["compilation_config"] = {"mode": 0, "cudagraph_mode": "FULL_DECODE_ONLY"}
    llm = LLM(
        model=str(model), dtype="bfloat16", gpu_memory_utilization=gpu_memory_utilization, max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens, enable_prefix_caching=True, seed=0,
        max_model_len=max(len(p) for p in ids) + max_tokens, **engine_args,
    )  # fmt: skip
    ready_s = time.perf_counter() - t0
    params = SamplingParams(n=n, temperature=1.0, max_tokens=max_tokens, logprobs=0, seed=0)
    batch = [TokensPrompt(prompt_token_ids=p) for p in ids]
    llm.generate(batch[:2], params, use_tqdm=False)  # warm-up: the first batch pays for lazy set-up
    t1 = time.perf_counter()
    outputs = llm.generate(batch, params, use_tqdm=False)
    gen_s = time.perf_counter() - t1
    responses = [list(c.token_ids) for o in outputs for c in o.outputs]
    row = {
        "kind": "gen", "max_num_seqs": max_num_seqs, "max_num_batched_tokens": max_num_batched_tokens,
        "graphs": graphs, "prompts": prompts, "n": n, "ready_s": round(ready_s, 2), "gen_s": round(gen_s, 3),
        "samples": len(responses), "response_tokens": sum(map(len, responses)),
        "prompt_tokens": sum(len(p) for p in ids) * n, "longest_response": max(map(len, responses)),
    }  # fmt: skip
    _append(out, row)
    (out.parent / f"{out.stem}.responses.json").write_text(json.dumps({"prompts": ids, "n": n, "responses": responses}))
    return row


def _micro_batches(seqs: Sequence[Sequence[int]], max_tokens: int) -> list[list[int]]:
    """Indices of ``seqs`` packed in order into micro batches of at most ``max_tokens`` tokens."""
    batches: list[list[int]] = [[]]
    used = 0
    for i, s in enumerate(seqs):
        if batches[-1] and used + len(s) > max_tokens:
            batches.append([])
            used = 0
        batches[-1].append(i)
        used += len(s)
    return batches


def _step(model: Any, seqs: Sequence[Sequence[int]], prompt_lens: Sequence[int], device: str) -> Any:
    """One packed micro batch: forward, response log-probs and entropy, token-mean loss, backward."""
    import torch

    from trainer.in_verl.fast_logprobs import logprobs_by_row_blocks

    input_ids = torch.tensor([t for s in seqs for t in s], device=device).unsqueeze(0)
    position_ids = torch.cat([torch.arange(len(s), device=device) for s in seqs]).unsqueeze(0)
    mask = torch.zeros(input_ids.shape[1], dtype=torch.bool, device=device)
    start = 0
    for s, p in zip(seqs, prompt_lens, strict=True):
        mask[start + p - 1 : start + len(s) - 1] = True  # positions whose next token is a response token
        start += len(s)
    if not bool(mask.any()):
        return None
    with torch.autocast(device_type=device.split(":")[0], dtype=torch.bfloat16):
        logits = model(input_ids=input_ids, position_ids=position_ids).logits[0]
    labels = torch.roll(input_ids[0], -1)
    chosen = logits[mask].float()
    logp = logprobs_by_row_blocks(chosen, labels[mask])
    entropy = (torch.logsumexp(chosen, -1) - (chosen.softmax(-1) * chosen).sum(-1)).detach()
    loss = -(logp * torch.randn_like(logp)).mean()  # an advantage-weighted token mean
    loss.backward()  # type: ignore[no-untyped-call]
    return entropy.mean()


def measure_update(
    model_dir: Path, responses_file: Path, out: Path, *, mini_batch: int | None = None,
    max_tokens: int | None = None, device: str = "cuda", profile: bool = True,
) -> dict[str, Any]:  # fmt: skip
    """``mini_batch`` (samples), ``max_tokens`` (a micro batch's): None takes :func:`b1_work`'s."""
    import torch
    from transformers import AutoModelForCausalLM

    import trainer.in_verl.packed_attention as packed

    packed.install()
    work = b1_work()
    mini_batch, max_tokens = mini_batch or work["mini_batch"], max_tokens or work["micro_tokens"]
    data = json.loads(responses_file.read_text())
    n = data["n"]
    seqs: list[list[int]] = []
    prompt_lens: list[int] = []
    for i, r in enumerate(data["responses"]):
        p = data["prompts"][i // n]
        seqs.append(p + r)
        prompt_lens.append(len(p))
    model: Any = AutoModelForCausalLM.from_pretrained(
        str(model_dir), dtype=torch.float32, attn_implementation=packed.NAME
    )
    model.to(device).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6, fused=device.startswith("cuda"))
    minis = [list(range(i, min(i + mini_batch, len(seqs)))) for i in range(0, len(seqs), mini_batch)]

    def mini(idx: list[int]) -> None:
        for micro in _micro_batches([seqs[i] for i in idx], max_tokens):
            _step(model, [seqs[idx[j]] for j in micro], [prompt_lens[idx[j]] for j in micro], device)
        opt.step()
        opt.zero_grad(set_to_none=True)

    def sync() -> None:
        if device.startswith("cuda"):
            torch.cuda.synchronize()

    mini(minis[0])  # warm-up
    sync()
    times = []
    for idx in minis:
        t = time.perf_counter()
        mini(idx)
        sync()
        times.append(time.perf_counter() - t)
    top: list[dict[str, Any]] = []
    row: dict[str, Any]
    if profile:
        from torch.profiler import ProfilerActivity
        from torch.profiler import profile as torch_profile

        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.startswith("cuda") else [])
        with torch_profile(activities=acts) as prof:
            mini(minis[0])
            sync()
        key = "self_device_time_total" if device.startswith("cuda") else "self_cpu_time_total"
        for ev in sorted(prof.key_averages(), key=lambda e: getattr(e, key), reverse=True)[:15]:
            top.append({"op": ev.key, "self_ms": round(getattr(ev, key) / 1000, 2), "calls": ev.count})
    row = {
        "kind": "update", "mini_batch": mini_batch, "max_tokens": max_tokens, "mini_batches": len(minis),
        "tokens": sum(map(len, seqs)), "mini_batch_s": [round(t, 3) for t in times],
        "update_s": round(sum(times), 3), "top_ops": top, "device": device,
    }  # fmt: skip
    _append(out, row)
    return row


def _append(out: Path, row: dict[str, Any]) -> None:
    row["command"] = run_record(quick=False, noisy=False)["command"]  # the exact command of this measurement
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("a") as f:
        f.write(json.dumps(row) + "\n")


def report(lines_file: Path, name: str = NAME, notes: str = "") -> dict[str, Any]:
    rows = [json.loads(line) for line in lines_file.read_text().splitlines() if line.strip()]
    gens = [r for r in rows if r["kind"] == "gen"]
    updates = [r for r in rows if r["kind"] == "update"]
    if not rows:
        raise ValueError(f"{lines_file}: no measurement")
    run = run_record(quick=False, noisy=False)
    payload: dict[str, Any] = {"run": run, "gen": gens, "update": updates, "notes": notes}
    md = [f"# {NAME.replace('_', ' ')}: a GRPO step's generation and update without VERL\n",
          f"- command: `{run['command']}`; lines from `{lines_file}`\n"]  # fmt: skip
    if gens:
        md.append("## Generation (vllm.LLM, one call)\n")
        md.append(md_table(
            ["max_num_seqs", "batched tokens", "graphs", "prompts x n", "ready s", "gen s", "response tokens",
             "longest", "prompt tokens"],
            [[g["max_num_seqs"], g["max_num_batched_tokens"], g["graphs"], f"{g['prompts']} x {g['n']}", g["ready_s"],
              g["gen_s"], g["response_tokens"], g["longest_response"], g["prompt_tokens"]] for g in gens],
        ))  # fmt: skip
    for u in updates:
        md.append(f"\n## Update: {u['mini_batches']} mini batches of {u['mini_batch']}, {u['tokens']} tokens, "
                  f"micro batches of <= {u['max_tokens']} tokens ({u['device']})\n")  # fmt: skip
        md.append(f"{u['update_s']} s in all; per mini batch {u['mini_batch_s']}\n\n")
        if u["top_ops"]:
            md.append(md_table(["op (one mini batch)", "self ms", "calls"],
                               [[o["op"], o["self_ms"], o["calls"]] for o in u["top_ops"]]))  # fmt: skip
    md.append("\n## Commands\n\n" + "\n".join(f"- `{r.get('command', '?')}`" for r in rows) + "\n")
    if notes:
        md.append("\n" + notes.strip() + "\n")
    write_result(name, payload, "\n".join(md), quick=False)
    return payload
