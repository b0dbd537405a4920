"""The trainer of the GRPO phases, :class:`PhaseTrainer`: VERL 0.9.1's own synchronous trainer plus the
phase's rules (early stopping of :mod:`trainer.phase_rules.early_stopping`, the failure policy of
:mod:`trainer.phase_rules.rollout_failures`, the dynamic-sampling budget and monitors of
:mod:`trainer.phase_rules.monitors`).

Why this shape. VERL takes its synchronous path only when ``trainer.v1.trainer_mode`` is exactly
``"sync"``: ``PPOTrainer._build_replay_buffer`` picks ``ReplayBuffer`` (not ``ReplayBufferAsync``)
and its ``gen_batch_size``; ``_init_dataloader`` computes ``requires_exact_refill = trainer_mode !=
"sync" or …`` and otherwise forces ``data.gen_batch_size=1``; ``_load_checkpoint`` /
``_save_checkpoint`` restore and save TransferQueue state and ``_reissue_inflight_prompts``
re-issues in-flight prompts only when the mode is not ``"sync"``; ``trainer.v1.<mode>`` holds the
mode's own settings. A trainer registered under another mode name therefore runs VERL's async
semantics. So the mode stays ``"sync"``, and :func:`install` points VERL's registry entry
``"sync"`` (``trainer_base.TRAINER_REGISTRY``, read by ``get_trainer_cls`` in
``TaskRunnerV1.run``) at :class:`PhaseTrainer`, a subclass of VERL's ``PPOTrainerSync``.
It is a narrow patch: one dict entry, in the Ray task-runner process that builds the trainer
(:mod:`trainer.in_verl.verl_main`), and every ``trainer_mode == "sync"`` branch of VERL still applies.
``register_trainer`` refuses to re-register a name, which is why the entry is set directly.

Early stopping: every validation of ``PPOTrainer.fit`` goes through ``_validate()``
(``val_before_train`` and every ``test_freq`` step), and the loop runs ``while global_steps <=
total_training_steps``. Lowering ``total_training_steps`` to the current step when patience runs
out ends the loop after this step's logging, through VERL's own exit path. Checkpoints are saved
before validation on the same steps (``save_freq == test_freq``), so the best validated step always
has a checkpoint; the others are pruned (the latest is kept for resume). On resume (``on_init_end``,
after ``_load_checkpoint`` set ``global_steps``) a step the state file already scored is not
validated again, and a step it never scored (its validation failed) is.

Reward API readiness: ``on_init_end`` (workers and rollout servers up, before validation step 0) waits
for the phase's reward API (:mod:`trainer.phase_rules.reward_ready`, the ``reward_ready`` keys): the loop starts
C1's executors beside the trainer, so the minutes of VERL's start-up and theirs overlap.

Dynamic sampling and monitors (:mod:`trainer.phase_rules.monitors`): ``prepare_step`` and
``_add_prompts_to_generate`` (the replay buffer's refill) count the prompts a step generates, and
stop the phase past ``algorithm.filter_groups.max_num_gen_batches`` batches (VERL's V1 buffer ignores
that key and would refill for ever); ``_balance_batch`` (first call after sampling) logs the share of
the step's samples whose reward reported ``valid_json``.

Sampling: ``_build_replay_buffer`` sets the buffer's poll interval from ``replay_buffer.poll_s``; under dynamic
sampling ``prepare_step`` sends the step's expected shortfall with its first batch
(:mod:`trainer.in_verl.prefetch`, ``replay_buffer.prefetch_max_factor``) and the buffer's ``sample`` reports each
step's evictions back to it.

Failures: ``on_sample_end`` (right after ``ReplayBuffer.sample``, before the update and the
checkpoint) counts the failed rollouts of the step; in mask mode (:mod:`trainer.phase_rules.failure_mask`)
``_compute_advantage`` then zeroes the response and loss masks of the masked samples (and of groups left
with fewer than two valid ones) in the TransferQueue before VERL reads them, counts them with the failed
rollouts, and the estimator ``grpo_masked`` (:mod:`trainer.in_verl.advantages`) leaves them out of their
groups. ``_val_metrics_update`` (which ``_validate`` calls with every scored sample and
``expected_acc_counts``) leaves the masked samples out of the validation metrics and compares the scored
samples with the validation set. Both stop the phase beyond ``failures.max_share``.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf, open_dict
from tensordict import TensorDict
from verl.trainer.ppo.v1 import trainer_base
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync

from trainer.in_verl import advantages  # registers grpo_masked and greedy_baseline in this process
from trainer.in_verl.greedy_baseline import GREEDY_SAMPLING, GreedyPrompt, GreedyRewards, greedy_rewards
from trainer.in_verl.prefetch import GroupPrefetch
from trainer.phase_rules.early_stopping import (
    STATE_FILE,
    Decision,
    EarlyStopper,
    EarlyStoppingConfig,
    prune_checkpoints,
)
from trainer.phase_rules.failure_mask import MaskPlan, group_of, plan_training_mask, split_validation
from trainer.phase_rules.monitors import (
    DEFAULT_KL_FLOOR,
    DynamicSamplingBudget,
    DynamicSamplingExhaustedError,
    valid_output_metrics,
    write_monitor_config,
)
from trainer.phase_rules.reward_ready import DEFAULT_TIMEOUT_S, READY_FILE, wait_for_reward_api
from trainer.phase_rules.rollout_failures import (
    FAILURE_FILE,
    FailureCount,
    FailurePolicy,
    RewardFailureLog,
    RolloutFailureError,
    describe_cause,
    judge,
    masked_cause,
    training_failures,
    validation_failures,
    with_masked,
)
from trainer.registry.phases import GRPO_PHASES, reward_of

TRAINER_MODE = "sync"
log = logging.getLogger(__name__)


def stopper_from_config(config: DictConfig) -> EarlyStopper:
    """The phase's stopper; its state file sits next to the checkpoints (resume-safe)."""
    raw = OmegaConf.to_container(config.early_stopping, resolve=True)
    assert isinstance(raw, dict)
    cfg = EarlyStoppingConfig.from_mapping({str(k): v for k, v in raw.items()})
    if cfg.enabled and int(config.trainer.save_freq) != int(config.trainer.test_freq):
        raise ValueError(
            "early_stopping: trainer.save_freq must equal trainer.test_freq so every validated step has a "
            f"checkpoint (got save_freq={config.trainer.save_freq}, test_freq={config.trainer.test_freq})"
        )
    return EarlyStopper(cfg, Path(str(config.trainer.default_local_dir)) / STATE_FILE)


def failure_policy_from_config(config: DictConfig) -> FailurePolicy:
    raw = OmegaConf.to_container(config.get("failures") or {}, resolve=True)
    assert isinstance(raw, dict)
    try:
        return FailurePolicy.model_validate(raw)
    except ValueError as exc:
        raise ValueError(f"failures: {exc}") from None


def reward_failure_log_path(config: DictConfig) -> str | None:
    kwargs = config.reward.custom_reward_function.get("reward_kwargs") or {}
    path = kwargs.get("failure_log")
    return str(path) if path else None


def wait_for_reward_api_of(config: DictConfig) -> float:
    """Wait (``reward_ready``) until the phase's reward API can score; a pipeline phase also needs its executor."""
    url = (config.reward.custom_reward_function.get("reward_kwargs") or {}).get("url")
    if not url:
        return 0.0
    ready = config.get("reward_ready") or {}
    if not ready.get("wait", True):
        return 0.0
    abort = ready.get("abort_file")
    name = str(config.phase.name)
    pipeline = name in GRPO_PHASES and reward_of(name) == "pipeline"
    waited = wait_for_reward_api(
        str(url),
        pipeline=pipeline,
        timeout_s=float(ready.get("timeout_s", DEFAULT_TIMEOUT_S)),
        abort_file=Path(str(abort)) if abort else None,
    )
    # beside the checkpoints: what the start-up report reads (how long the trainer waited, and when it went on)
    ckpt_dir = Path(str(config.trainer.default_local_dir))
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    record = {
        "url": str(url),
        "pipeline": pipeline,
        "waited_s": round(waited, 1),
        "ready_at_unix": round(time.time(), 1),
    }
    (ckpt_dir / READY_FILE).write_text(json.dumps(record) + "\n")
    return waited


def prefetch_from_config(config: DictConfig) -> GroupPrefetch:
    """``replay_buffer.prefetch_max_factor`` / ``prefetch_smoothing``; off without dynamic sampling."""
    block = config.get("replay_buffer") or {}
    filter_groups = (config.get("algorithm") or {}).get("filter_groups") or {}
    factor = float(block.get("prefetch_max_factor") or 1.0) if filter_groups.get("enable", False) else 1.0
    return GroupPrefetch(max_factor=factor, smoothing=float(block.get("prefetch_smoothing") or 0.5))


def apply_decision(trainer: Any, decision: Decision) -> None:
    """Make VERL's loop end after the current step (it checks ``global_steps <= total_training_steps``)."""
    if decision.stop and decision.step > 0:
        trainer.total_training_steps = min(int(trainer.total_training_steps), decision.step)


def install(config: DictConfig) -> type[PPOTrainerSync]:
    """Make VERL's ``sync`` mode build :class:`PhaseTrainer` in this process."""
    mode = config.trainer.v1.trainer_mode
    if mode != TRAINER_MODE:
        raise ValueError(
            f"trainer.v1.trainer_mode must be {TRAINER_MODE!r} (VERL's synchronous path; early stopping and the "
            f"failure policy hook into it), got {mode!r}"
        )
    trainer_base.TRAINER_REGISTRY[TRAINER_MODE] = PhaseTrainer
    return PhaseTrainer


EXECUTOR_CAUSES = ("executor_failed", "executor_truncated", "prompt_too_long")


def executor_of(config: DictConfig, timeout_s: float = 5.0) -> str:
    """The executor behind the phase's reward API, as its ``/info`` names it (served model, replicas, the
    attempt timeout and retries; never its URL), for a stop an executor caused."""
    import os

    import httpx

    from trainer.in_verl.reward_batcher import TOKEN_ENV, URL_ENV

    kwargs = config.reward.custom_reward_function.get("reward_kwargs") or {}
    url = str(kwargs.get("url") or os.environ.get(URL_ENV) or "")
    if not url:
        return ""
    token = os.environ.get(TOKEN_ENV)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        resp = httpx.get(f"{url.rstrip('/')}/info", headers=headers, timeout=timeout_s)
        resp.raise_for_status()
        ex = resp.json()["executor"]
        return (
            f"executor: model {ex.get('model')!r} behind the reward API at {url} ({ex.get('replicas')} replica(s), "
            f"{ex.get('timeout_s')} s an attempt, {ex.get('retries')} retries, max_tokens {ex.get('max_tokens')})"
        )
    except Exception as exc:  # the stop goes on; only the name is missing
        return f"executor: the one behind the reward API at {url} (its /info did not say: {type(exc).__name__})"


def uses_greedy_baseline(config: DictConfig) -> bool:
    return str(config.algorithm.adv_estimator) == advantages.GREEDY_BASELINE


def _plain(value: Any) -> Any:
    """A TransferQueue value as plain Python (NonTensorData → its data; containers → dict/list)."""
    value = getattr(value, "data", value)
    if hasattr(value, "items"):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, torch.Tensor):
        return value.tolist()
    return value


def greedy_prompts(batch: Any, tq: Any) -> list[GreedyPrompt]:
    """One prompt a group of ``batch`` (VERL's padding left out), read from the TransferQueue as the agent loop
    put it: the prompt's token ids, ``data_source``, ``reward_model.ground_truth`` and ``extra_info``."""
    first: dict[str, str] = {}
    for key, tag in zip(batch.keys, batch.tags, strict=True):
        if not tag.get("is_padding", False):
            first.setdefault(group_of(key), key)
    if not first:
        return []
    keys = list(first.values())
    fields = ["prompts", "data_source", "reward_model", "extra_info"]
    data = tq.kv_batch_get(keys=keys, partition_id=batch.partition_id, select_fields=fields)
    prompts = data["prompts"]
    prompt_ids = [t.tolist() for t in prompts.unbind()] if prompts.is_nested else prompts.tolist()
    out = []
    for i, uid in enumerate(first):
        reward_model = _plain(data["reward_model"][i])
        out.append(
            GreedyPrompt(
                uid=uid,
                prompt_ids=[int(t) for t in prompt_ids[i]],
                data_source=str(_plain(data["data_source"][i])),
                ground_truth=reward_model.get("ground_truth") if isinstance(reward_model, dict) else None,
                extra_info=_plain(data["extra_info"][i]) or {},
            )
        )
    return out


def reward_info(extra_fields: Any) -> dict[str, Any]:
    """A trajectory's reward parts: VERL keeps the reward function's extra keys under ``reward_extra_info``."""
    fields = getattr(extra_fields, "data", extra_fields)
    info = fields.get("reward_extra_info", {}) if hasattr(fields, "get") else {}
    return dict(info) if hasattr(info, "items") else {}


def zero_rows(mask: torch.Tensor, rows: tuple[int, ...]) -> torch.Tensor:
    """``mask`` (nested, one row a sample, as VERL keeps it in the TransferQueue, or padded) with ``rows`` zeroed;
    the other rows and every length unchanged."""
    if not mask.is_nested:
        out = mask.clone()
        out[list(rows)] = 0
        return out
    parts = list(mask.unbind())
    for row in rows:
        parts[row] = torch.zeros_like(parts[row])
    return torch.nested.as_nested_tensor(parts, layout=torch.jagged)


def _without_masked(
    keep: list[int],
    n: int,
    data_sources: Any,
    sample_uids: Any,
    infos: Any,
    sample_turns: Any,
    expected_acc_counts: dict[tuple[str, str], int] | None,
) -> tuple[Any, Any, Any, Any, dict[tuple[str, str], int] | None]:
    """The validation's per-sample lists without the masked rows (every list of ``n`` rows), and the expected
    counts of their groups lowered by the masked samples."""

    def pick(values: Any) -> Any:
        return [values[i] for i in keep] if values is not None and len(values) == n else values

    kept = set(keep)
    expected = dict(expected_acc_counts) if expected_acc_counts is not None else None
    if expected is not None:
        for i in range(n):
            if i not in kept:
                key = (str(data_sources[i]), str(sample_uids[i]))
                if key in expected:
                    expected[key] = max(0, expected[key] - 1)
    filtered = {k: pick(v) for k, v in infos.items()}
    return pick(list(data_sources)), pick(list(sample_uids)), filtered, pick(sample_turns), expected


class PhaseTrainer(PPOTrainerSync):
    """VERL's PPOTrainerSync plus the phase's rules: early stopping, the failure policy, the dynamic-sampling
    budget and the monitors."""

    def __init__(self, config: DictConfig) -> None:
        super().__init__(config)
        self.early_stopper = stopper_from_config(config)
        self.failure_policy = failure_policy_from_config(config)
        ckpt_dir = Path(str(config.trainer.default_local_dir))
        self.failure_file = ckpt_dir / FAILURE_FILE
        self.reward_failures = RewardFailureLog(reward_failure_log_path(config))
        self._failure_metrics: dict[str, float] = {}
        self._sampled: Any = None  # the step's batch (greedy_baseline)
        self._greedy: GreedyRewards | None = None
        self.dynamic_sampling = DynamicSamplingBudget.from_config(config)
        self.prefetch = prefetch_from_config(config)
        self._step_prompts = 0
        monitors = config.get("monitors") or {}
        write_monitor_config(ckpt_dir, float(monitors.get("kl_floor", DEFAULT_KL_FLOOR)))

    # -- sampling -----------------------------------------------------------------------------------
    def _build_replay_buffer(self) -> Any:
        """VERL's buffer, polling every ``replay_buffer.poll_s`` (VERL hard-codes 2.0 s: a step's sampling
        then ends up to 2 s after its last group finished, and generation times cluster at multiples of 2 s)."""
        buffer = super()._build_replay_buffer()
        poll = (self.config.get("replay_buffer") or {}).get("poll_s")
        if poll is not None:
            if float(poll) <= 0:
                raise ValueError(f"replay_buffer.poll_s must be positive, got {poll}")
            buffer.poll_interval = float(poll)
        sample = buffer.sample

        def sample_and_keep(*args: Any, **kwargs: Any) -> Any:
            out = sample(*args, **kwargs)
            if uses_greedy_baseline(self.config):
                self._sampled = out[0]  # the step's batch, for its greedy answers (on_sample_end)
            if kwargs.get("partition_id", "train") == "train":
                evicted = int((out[1] or {}).get("training/filter_groups/evicted_samples", 0))
                self.prefetch.observe(self._step_prompts, evicted)
            return out

        buffer.sample = sample_and_keep
        return buffer

    # -- resume -------------------------------------------------------------------------------------
    def on_init_end(self) -> None:
        super().on_init_end()  # type: ignore[no-untyped-call]
        wait_for_reward_api_of(self.config)
        step = int(self.global_steps)
        if step <= 0:
            return
        scored = self.early_stopper.has_evaluation(step)
        with open_dict(self.config):
            # A scored step is not validated again (same score, no patience spent); a step whose
            # validation never finished (it failed) is validated before training goes on.
            self.config.trainer.val_before_train = not scored
        log.info("resume at step %s: validation before training %s", step, "skipped" if scored else "forced")

    # -- dynamic sampling and monitors ---------------------------------------------------------------
    def prepare_step(self) -> dict[Any, Any]:
        batch = int(self.config.data.train_batch_size)
        self._step_prompts = batch  # the batch VERL submits first
        out: dict[Any, Any] = super().prepare_step()
        extra = self.prefetch.first_dispatch(batch) - batch
        cap = self.dynamic_sampling.max_prompts
        if cap is not None:
            extra = min(extra, cap - self._step_prompts)  # the prefetch never spends the refills' budget alone
        if extra > 0:
            # the expected shortfall, sent now rather than after the first round's evictions
            self._step_prompts += extra
            PPOTrainerSync._add_prompts_to_generate(self, extra)
            out["training/dynamic_sampling/prefetched_prompts"] = float(extra)
        return out

    def _add_prompts_to_generate(self, num_prompts: int) -> int:
        """The replay buffer's refill of evicted (all-equal) groups, within the step's budget."""
        try:
            self.dynamic_sampling.check(int(self.global_steps), self._step_prompts, num_prompts)
        except DynamicSamplingExhaustedError as exc:
            self._write_stop(str(exc), "dynamic_sampling_exhausted")
            raise
        self._step_prompts += num_prompts
        added: int = super()._add_prompts_to_generate(num_prompts)
        return added

    def _balance_batch(self, batch: Any, metrics: Any, *args: Any, **kwargs: Any) -> Any:
        if metrics is not None:
            metrics.update(self._valid_output_metrics(batch))
        return super()._balance_batch(batch, metrics, *args, **kwargs)

    def _valid_output_metrics(self, batch: Any) -> dict[str, float]:
        from verl.trainer.ppo.v1 import replay_buffer

        try:
            data = replay_buffer.tq.kv_batch_get(  # type: ignore[attr-defined]
                keys=list(batch.keys), partition_id=batch.partition_id, select_fields=["extra_fields"]
            )
            padding = [bool(tag.get("is_padding", False)) for tag in batch.tags]
            return valid_output_metrics(list(data["extra_fields"]), padding)
        except Exception as exc:  # a monitor never stops training; its absence shows in the phase result
            log.warning("valid-output monitor: could not read the step's extra_fields: %s", exc)
            return {}

    def _write_stop(self, message: str, cause: str) -> None:
        self.failure_file.parent.mkdir(parents=True, exist_ok=True)
        record = {"where": "training", "step": int(self.global_steps), "cause": cause, "message": message}
        self.failure_file.write_text(json.dumps(record, indent=2) + "\n")

    # -- training failures --------------------------------------------------------------------------
    def on_sample_end(self) -> None:
        if uses_greedy_baseline(self.config) and self._sampled is not None:
            # before VERL sleeps the replicas: they still hold the weights that wrote this step's samples
            self._greedy = self._greedy_rewards(self._sampled)
            self._failure_metrics.update(self._greedy.as_metrics())
        super().on_sample_end()  # type: ignore[no-untyped-call]
        if self.dynamic_sampling.enabled:
            self._failure_metrics["training/dynamic_sampling/generated_prompts"] = float(self._step_prompts)
        self._check_training_failures()

    def _step_once(self, metrics: dict[str, Any], timing_raw: dict[str, Any], sample_batch_size: int) -> Any:
        try:
            return super()._step_once(metrics, timing_raw, sample_batch_size)
        except (RolloutFailureError, DynamicSamplingExhaustedError):
            raise
        except Exception as exc:
            # e.g. VERL's own "selected terminal groups with no materializable trajectories" when
            # every group failed: keep VERL's error as the __cause__, and name the cause it cannot see.
            entries = self.reward_failures.new_entries()
            if not entries:
                raise
            self._stop(self._training_count(), describe_cause(entries), exc)
            raise

    # -- mask mode --------------------------------------------------------------------------------
    def _compute_advantage(self, batch: Any, metrics: dict[str, Any]) -> Any:
        if self.failure_policy.mode == "mask":
            self._mask_failed_samples(batch, metrics)
        if not uses_greedy_baseline(self.config):
            return super()._compute_advantage(batch, metrics)
        greedy, self._greedy = self._greedy, None
        if greedy is None:
            raise RuntimeError("greedy_baseline: no greedy rewards for this step (on_sample_end did not run)")
        with advantages.greedy_baselines(greedy.rewards):
            return super()._compute_advantage(batch, metrics)

    def _greedy_rewards(self, batch: Any) -> GreedyRewards:
        """The greedy answer of each prompt group of ``batch`` and its reward (:mod:`trainer.in_verl.greedy_baseline`),
        through VERL's rollout client and the phase's reward function."""
        import asyncio
        import uuid
        from concurrent.futures import ThreadPoolExecutor

        from trainer.in_verl.reward_batcher import batchers_of_running_loop
        from trainer.in_verl.reward_fn import compute_score

        prompts = greedy_prompts(batch, trainer_base.tq)  # type: ignore[attr-defined]
        client = self.get_llm_client()
        kwargs = OmegaConf.to_container(self.config.reward.custom_reward_function.get("reward_kwargs") or {})
        assert isinstance(kwargs, dict)
        reward_kwargs = {str(k): v for k, v in kwargs.items() if k != "failure_log"}

        async def generate(uid: str, prompt_ids: list[int]) -> list[int]:
            request = f"greedy-{uid}-{uuid.uuid4().hex[:8]}"
            out = await client.generate(request_id=request, prompt_ids=prompt_ids, sampling_params=GREEDY_SAMPLING)
            return list(out.token_ids)

        async def score(data_source: str, text: str, truth: Any, extra: dict[str, Any]) -> Any:
            return await compute_score(data_source, text, truth, extra, **reward_kwargs)

        def decode(ids: list[int]) -> str:
            return str(self.tokenizer.decode(ids, skip_special_tokens=True))

        async def run() -> GreedyRewards:
            try:
                return await greedy_rewards(prompts, generate, decode, score, int(self.config.data.max_response_length))
            finally:
                for b in batchers_of_running_loop():
                    await b.aclose()

        with ThreadPoolExecutor(1) as pool:  # its own event loop, whatever the trainer's thread runs
            out = pool.submit(asyncio.run, run()).result()
        if out.errors:
            log.warning("greedy baseline: %d prompt(s) without one: %s", len(out.errors), "; ".join(out.errors[:3]))
        return out

    def _mask_failed_samples(self, batch: Any, metrics: dict[str, Any]) -> MaskPlan:
        """Zero the masks of the samples without a gradient (TransferQueue, before VERL reads them), count them
        with the step's failed rollouts, and stop the phase beyond ``failures.max_share``."""
        tq: Any = trainer_base.tq  # type: ignore[attr-defined]  # the TransferQueue client VERL uses

        keys, partition = list(batch.keys), batch.partition_id
        fields = tq.kv_batch_get(keys=keys, partition_id=partition, select_fields=["extra_fields"])
        padding = [bool(tag.get("is_padding", False)) for tag in batch.tags]
        plan = plan_training_mask(keys, [reward_info(f) for f in fields["extra_fields"]], padding)
        metrics.update(plan.as_metrics())
        count = with_masked(self._training_count(), plan)
        self._failure_metrics.update(count.as_metrics())
        if count.failed:
            self._stop(count, self._cause(plan, count), policy=self.failure_policy)
        if plan.samples and len(plan.no_gradient) >= plan.samples:
            self._stop_without_gradient(plan, count)
        if plan.no_gradient:
            masks = {}
            for name in ("response_mask", "loss_mask"):
                try:
                    masks[name] = tq.kv_batch_get(keys=keys, partition_id=partition, select_fields=[name])[name]
                except Exception:  # a field this VERL does not keep: the other one carries the mask
                    continue
            if "response_mask" not in masks:
                raise RuntimeError("mask mode: the batch has no response_mask in the TransferQueue")
            put = {name: zero_rows(mask, plan.no_gradient) for name, mask in masks.items()}
            tq.kv_batch_put(keys=keys, partition_id=partition, fields=TensorDict(put, batch_size=len(keys)))
        return plan

    def _stop_without_gradient(self, plan: MaskPlan, count: FailureCount) -> None:
        """Within ``max_share``, yet no group kept two valid samples: nothing to train on (and VERL's token-mean
        loss would divide by zero tokens)."""
        message = (
            f"training step {count.step}: no sample has a gradient: {plan.masked} of {plan.samples} samples masked "
            f"and {plan.dropped_groups} group(s) left with fewer than two valid ones. Cause: "
            f"{self._cause(plan, count)}"
        )
        self._write_stop(message, "no_gradient")
        self._log_failure_metrics(count)
        raise RolloutFailureError(message)

    def _cause(self, plan: MaskPlan, count: FailureCount) -> str:
        """What a stop names: the masked samples' causes, the reward errors, and the executor when one caused it
        (asked only when the share is past the policy: a stop is coming)."""
        cause = masked_cause(plan, count, self.reward_failures.new_entries())
        if any(plan.causes.get(c) for c in EXECUTOR_CAUSES) and (
            count.share > self.failure_policy.max_share or len(plan.no_gradient) >= plan.samples
        ):
            cause += f"; {executor_of(self.config)}"
        return cause

    def _training_count(self) -> FailureCount:
        n = int(self.config.actor_rollout_ref.rollout.n)
        per_step = int(self.config.data.train_batch_size) // int(self.parameter_sync_step)
        return training_failures(self.replay_buffer, n, int(self.global_steps), per_step * n)

    def _check_training_failures(self) -> None:
        count = self._training_count()
        self._failure_metrics.update(count.as_metrics())
        if count.failed:
            self._stop(count, describe_cause(self.reward_failures.new_entries()), policy=self.failure_policy)

    def _stop(
        self,
        count: FailureCount,
        cause: str,
        verl_error: BaseException | None = None,
        policy: FailurePolicy | None = None,
    ) -> None:
        """Raise unless ``policy`` allows the failures (without one, always raise).

        The counts of a stopped step are logged here, since VERL never reaches its own logging of
        that step; allowed ones go out with the step's or the validation's metrics.
        """
        error = judge(count, policy or FailurePolicy(max_share=0.0), cause, self.failure_file)
        if error is not None:
            self._log_failure_metrics(count)
            raise error from verl_error

    def _consume_sync_metrics(self) -> dict[str, Any]:
        metrics: dict[str, Any] = super()._consume_sync_metrics()
        metrics.update(self._failure_metrics)
        self._failure_metrics = {}
        return metrics

    def _log_failure_metrics(self, count: FailureCount) -> None:
        tracking = getattr(self, "logger", None)
        if tracking is not None:
            tracking.log(data=count.as_metrics(), step=int(self.global_steps))

    # -- validation ---------------------------------------------------------------------------------
    def _val_metrics_update(
        self,
        data_sources: Any,
        sample_uids: Any,
        reward_extra_infos_dict: Any,
        sample_turns: Any,
        expected_acc_counts: dict[tuple[str, str], int] | None = None,
    ) -> dict[str, float]:
        expected = sum((expected_acc_counts or {}).values())
        n = len(sample_uids)
        keep, plan = split_validation(reward_extra_infos_dict, n)
        count = validation_failures(int(self.global_steps), n, expected, plan.masked)
        if count.failed:
            self._stop(count, self._cause(plan, count), policy=self.failure_policy)
        if plan.masked:  # the masked samples are out of every validation metric (so of early stopping's score)
            data_sources, sample_uids, reward_extra_infos_dict, sample_turns, expected_acc_counts = _without_masked(
                keep, n, data_sources, sample_uids, reward_extra_infos_dict, sample_turns, expected_acc_counts
            )
        metrics: dict[str, float] = super()._val_metrics_update(
            data_sources, sample_uids, reward_extra_infos_dict, sample_turns, expected_acc_counts=expected_acc_counts
        )
        metrics.update(count.as_metrics())
        metrics.update(plan.as_metrics())
        return metrics

    def _validate(self) -> dict[str, float]:
        try:
            metrics: dict[str, float] = super()._validate()
        except RolloutFailureError:
            raise
        except Exception as exc:
            entries = self.reward_failures.new_entries()
            if not entries:
                raise
            # Every sample failed, and VERL's _validate broke on the empty batch before counting.
            expected = len(self.val_dataset) * int(self.config.actor_rollout_ref.rollout.val_kwargs.n)
            self._stop(
                FailureCount("validation", int(self.global_steps), expected, expected), describe_cause(entries), exc
            )
            raise
        step = int(self.global_steps)
        decision = self.early_stopper.update(step, metrics)
        metrics.update(decision.as_metrics())
        apply_decision(self, decision)
        if step > 0:
            ckpt_dir = Path(str(self.config.trainer.default_local_dir))
            removed = prune_checkpoints(ckpt_dir, keep={decision.best_step, step})
            if removed:
                log.info("early stopping: pruned checkpoints %s (best %s)", removed, decision.best_step)
        if decision.stop:
            print(
                f"[early_stopping] stop at step {step}: no gain > {self.early_stopper.cfg.min_delta} for "
                f"{decision.bad_evals} validations; best step {decision.best_step} "
                f"(score {decision.best_score:.4f})",
                flush=True,
            )
        return metrics
