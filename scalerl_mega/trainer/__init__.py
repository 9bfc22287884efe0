"""Policy trainers (the PolicyTrainer seam). Megatron-Core lives in `trainer.megatron`."""
