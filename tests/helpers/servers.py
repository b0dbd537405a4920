"""Real server processes for tests: the reward_api under uvicorn, started as a subprocess.

Fault-injecting executors live in ``tests/helpers/faulty_executor.py``; nothing here fakes a real part.
"""

from services.reward_api.process import RewardApiProcess as RewardApiServer

__all__ = ["RewardApiServer"]
