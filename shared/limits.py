"""Max new tokens of each kind of answer the models write, each declared once; every default elsewhere reads
these (the GRPO phase configs, which cannot import Python, are checked against them by a test).

A deliberate small-scale run (the CPU demo, the CPU smokes, a micro-benchmark) passes a smaller value as an
override of one of these, and says so where it does.
"""

from __future__ import annotations

# π1's JSON schema in a GRPO rollout (B1, C1 ``data.max_response_length``): the longest gold schema is 121
# tokens (SmolLM2 tokenizer), so a correct schema is never cut.
SCHEMA_ANSWER_MAX_TOKENS = 256

# π2's NDJSON table in a GRPO rollout (B2, C2 ``data.max_response_length``) and in the reward API's Stage-2
# executor call (REWARD_API_MAX_TOKENS, C1's pipeline reward): the longest gold table is 203 tokens.
TABLE_ANSWER_MAX_TOKENS = 512

# An answer the trainer generates itself, outside a rollout (Phase D and `trainer evaluate`, `trainer infer`,
# C2's precomputed schemas, the preflight, RFT's samples): one budget for schemas and tables alike, the one the
# GPU runs used; a cut answer is counted and scored as wrong.
EVAL_ANSWER_MAX_TOKENS = 384
