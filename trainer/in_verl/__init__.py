"""Everything that runs inside VERL's processes, and nothing else.

VERL loads these by path or by module name, never through an import of ours: ``reward_fn`` (VERL's
``compute_score``, ``reward.custom_reward_function.path`` of the phase configs) with ``reward_batcher``
(its per-sample calls batched over the typed reward_api client, in VERL's reward workers); ``verl_main`` (the
GRPO entry point, ``python -m trainer.in_verl.verl_main``) and ``phase_trainer`` (the trainer it builds, VERL's
``PPOTrainerSync`` with the phase's rules); ``fast_logprobs``, ``packed_attention``, ``agent_loop_speed``,
``response_padding``, ``nested_batches`` and ``cpu_shim`` (``VERL_USE_EXTERNAL_MODULES``;
``import_hook`` patches a VERL module when it is imported); ``vllm_executor`` (the rollout's vLLM executor against
its GPU count, from ``verl_main``).
The VERL-free rules these apply (early stopping, the failure policy, the monitors) live in
``trainer.phase_rules``; the launcher reads the files they write. Nothing outside this package imports it, except
the tests.
"""
