"""Serving, in one place: a model (a vLLM executor) or the reward API, on CPU, on a GPU slot, or through
an external URL whose identity is checked.

| module | holds |
|---|---|
| ``executors`` | serve a model (``serve_model``: CPU, GPU slot or a checked URL), or replicas of it |
| ``reward_api`` | serve the reward API: local (with executors of its own) or a checked external URL |
| ``reward_api_env`` | the reward API's environment from its typed settings (field names, never hand-written keys) |
| ``gpus`` | which GPUs each stage of the loop gets (trainers and executors) |
| ``identity`` | model fingerprints and the check that a URL serves the expected model |
| ``endpoint`` | what a served model is to its clients (URL, served name, identity) |
| ``shutdown`` | SIGTERM as a clean exit in the entry points, so no server outlives its program |
"""
