"""The rules VERL's processes apply to a phase, free of VERL: early stopping (``early_stopping``), the failure
policy (``rollout_failures``) and its mask mode (``failure_mask``), the monitors summarised into the phase result
(``monitors``), the wait for the reward API before the first reward (``reward_ready``). ``trainer.in_verl`` applies
them inside VERL; the launcher and the recipes read the files they write."""
