"""HF <-> Megatron-Core weight conversion: per-architecture name/layout tables, sharding rules,
streaming safetensors I/O and the checkpoint converters used by ``tools/`` and weight export."""
