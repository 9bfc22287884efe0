"""Prompt data: sources (JSONL / Parquet / HF datasets), held-out split, curriculum, synthetic tasks."""
