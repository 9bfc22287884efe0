"""The `data` group (paper Sec. 2 "Scaling curve on held-out") and its checks."""

from __future__ import annotations

from dataclasses import dataclass, field

from scalerl_mega.config.checks import one_of, positive

DATA_NAMES = ("synthetic", "polaris", "deepcoder", "math_code", "jsonl")


@dataclass
class DataConfig:
    """Prompt sources and the held-out validation split (paper Sec. 2 "Scaling curve on held-out")."""

    name: str = "synthetic"
    """synthetic | polaris | deepcoder | math_code | jsonl (your own files; data/columns.py)."""
    train_files: list[str] = field(default_factory=list)
    """JSONL / Parquet files (or HF dataset names) for the non-synthetic sources."""
    code_files: list[str] = field(default_factory=list)
    """Extra code-task files mixed in by `math_code` (Deepcoder schema)."""
    synthetic_num_prompts: int = 20000
    """Number of distinct problems the synthetic task draws from (only for name=synthetic)."""
    synthetic_max_digits: int = 3
    synthetic_difficulty_weights: list[float] = field(default_factory=list)
    """Relative weight of each operand digit count 1..synthetic_max_digits (each operand draws its own);
    empty: uniform. E.g. [0, 0, 1, 1] with max_digits 4: both operands have 3 or 4 digits."""
    val_prompts: int = 1000
    """Held-out prompts (paper: 1,000 from Polaris-53K)."""
    val_samples: int = 16
    """Samples per validation prompt (paper: mean@16)."""
    val_paired_draws: bool = False
    """false: the validation sampling seeds include the run's `seed`, so seeds draw independent validation
    noise (runs of different recipes with the same seed still share their draws: paired by seed).
    true: every run draws the same random numbers whatever its seed (the old behaviour; common random
    numbers for A/B comparisons of one seed each, but seed spreads then understate the noise)."""
    split_seed: int = 0
    max_prompt_tokens: int = 2048
    tokenizer_path: str = ""
    """Local HF tokenizer directory (e.g. the model's HF checkpoint) for polaris/deepcoder/math_code."""
    template: str = ""
    """Prompt template with `{problem}` (the user turn under a chat template); empty: the task's default
    (data/sources.py)."""
    prompt_key: str = ""
    """Column of `train_files` holding the problem text; empty: the dataset's (problem)."""
    answer_key: str = ""
    """Column of `train_files` holding the reference (math answer / code tests); empty: the dataset's."""
    task: str = "math"
    """data=jsonl: the reward family of its rows, math | code."""
    use_chat_template: bool = True
    """Format prompts through the tokenizer's chat template when it has one."""

def validate_data(data: DataConfig) -> None:
    """`data.*` on its own (sizes that clash with other groups are checked by `config.tree.validate`)."""
    one_of("data.name", data.name, DATA_NAMES)
    positive("data.val_prompts", data.val_prompts, allow_zero=True)
    positive("data.val_samples", data.val_samples)
    positive("data.max_prompt_tokens", data.max_prompt_tokens)
    if data.name == "synthetic":
        positive("data.synthetic_num_prompts", data.synthetic_num_prompts)
        w = list(data.synthetic_difficulty_weights)
        if w and (len(w) != data.synthetic_max_digits or any(x < 0 for x in w) or sum(w) <= 0):
            raise ValueError(f"data.synthetic_difficulty_weights={w} must be {data.synthetic_max_digits} non-negative "
                             f"numbers (one per digit count 1..data.synthetic_max_digits) with a positive sum")
        if data.val_prompts >= data.synthetic_num_prompts:
            raise ValueError(f"data.val_prompts={data.val_prompts} must be < data.synthetic_num_prompts="
                             f"{data.synthetic_num_prompts} (the held-out set would take the whole dataset)")
