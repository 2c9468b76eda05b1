"""Entry scripts for training (sft, dpo, nca_p, grpo with its reward functions), the model card and the one Hub push,
resume checks, the demo, the studies, and the tiny offline models. Imports eval, losses, data_prep, store, vlm and
cli."""
