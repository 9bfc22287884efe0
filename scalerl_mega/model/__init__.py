"""Model configuration at the base of the package: the trainer's typed model / parallel / optimizer
configs and presets (`config`), Llama-3 RoPE scaling (`rope`), and the mapping to and from Hugging Face
config.json (`hf_export`, `hf_import`). Pure: no torch.distributed, megatron or HF model imports here."""
