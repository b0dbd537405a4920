"""The pure-Python core shared by the reward service, the trainer and the evaluation.

Prompts, schema/table parsing and metrics, reward definitions, golden-data IO and wire types live
here and nowhere else, so training data, rewards and evaluation can never disagree. No web
framework, torch or VERL is imported.
"""

from shared.aligned_metrics import AlignedMetrics, aligned_table_metrics
from shared.golden import (
    GoldenExample,
    GoldenFormatError,
    GoldSchema,
    GoldTable,
    golden_filename,
    iter_golden,
    read_golden,
    read_split,
    validate_folder,
    write_golden,
)
from shared.names import normalize_name
from shared.prompts import (
    PROMPT_VERSION,
    build_stage1_messages,
    build_stage2_messages,
    canonical_schema,
    canonical_schema_json,
    gold_ndjson,
    load_template,
    prompt_version,
    stage1_template,
    stage2_schema,
    stage2_template,
)
from shared.rewards import (
    EXECUTOR_FAILED,
    EXECUTOR_TRUNCATED,
    INVALID_JSON,
    INVALID_NDJSON,
    PROMPT_TOO_LONG,
    PipelineReward,
    PipelineSchemaRewardConfig,
    SchemaReward,
    SchemaRewardConfig,
    TableReward,
    TableRewardConfig,
    combine_pipeline_reward,
    compute_schema_reward_single,
    compute_table_reward_single,
    pipeline_reward_for_executor_failure,
    pipeline_reward_for_executor_truncated,
    pipeline_reward_for_invalid_schema,
    pipeline_reward_for_prompt_too_long,
)
from shared.schema_metrics import SchemaPRF, schema_prf_from_text
from shared.schema_parsing import parse_schema_text, strip_code_fence
from shared.table_metrics import cell_accuracy, gold_table_to_rows, normalize_cell, parse_ndjson, parse_ndjson_detailed

__version__ = "0.1.0"

__all__ = [
    "EXECUTOR_FAILED",
    "EXECUTOR_TRUNCATED",
    "INVALID_JSON",
    "INVALID_NDJSON",
    "PROMPT_TOO_LONG",
    "PROMPT_VERSION",
    "AlignedMetrics",
    "GoldSchema",
    "GoldTable",
    "GoldenExample",
    "GoldenFormatError",
    "PipelineReward",
    "PipelineSchemaRewardConfig",
    "SchemaPRF",
    "SchemaReward",
    "SchemaRewardConfig",
    "TableReward",
    "TableRewardConfig",
    "__version__",
    "aligned_table_metrics",
    "build_stage1_messages",
    "build_stage2_messages",
    "canonical_schema",
    "canonical_schema_json",
    "cell_accuracy",
    "combine_pipeline_reward",
    "compute_schema_reward_single",
    "compute_table_reward_single",
    "gold_ndjson",
    "gold_table_to_rows",
    "golden_filename",
    "iter_golden",
    "load_template",
    "normalize_cell",
    "normalize_name",
    "parse_ndjson",
    "parse_ndjson_detailed",
    "parse_schema_text",
    "pipeline_reward_for_executor_failure",
    "pipeline_reward_for_executor_truncated",
    "pipeline_reward_for_invalid_schema",
    "pipeline_reward_for_prompt_too_long",
    "prompt_version",
    "read_golden",
    "read_split",
    "schema_prf_from_text",
    "stage1_template",
    "stage2_schema",
    "stage2_template",
    "strip_code_fence",
    "validate_folder",
    "write_golden",
]
