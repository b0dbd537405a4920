"""The checks before a long GRPO run: what GRPO can use from the start policy (``preflight``: the advantage check
and the headroom over greedy) and whether the wiring can move the greedy answer at all (``positive_control``)."""
