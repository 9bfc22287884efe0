"""Weight quantization for the generators (`rollout.quantization`): blockwise FP8 (fp8.py), the checkpoint format
that carries it (checkpoint.py). Pure torch and dicts: no files, no config objects."""
