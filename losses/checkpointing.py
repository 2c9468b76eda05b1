"""Resuming full fine-tuning from a Trainer checkpoint of a model whose weights are saved in Hub format.

transformers 5 saves Qwen2-VL under the Hub key names (`model.embed_tokens...`, `visual...`) and converts them
back in `from_pretrained`, but `Trainer._load_from_checkpoint` (5.24) loads the file with a plain
`load_state_dict(strict=False)`: every renamed key is skipped and training silently restarts from the base
weights. Loading the checkpoint through `from_pretrained`, which applies the conversion, fixes that.
DeepSpeed and PEFT checkpoints take other paths and are left to the Trainer.

Saving: safetensors 0.8 writes its files with mode 0600, so colleagues sharing a machine could not read a trained
model or its checkpoints; every saved folder's weight files get the permissions of any new file (0666 less umask).
"""

from __future__ import annotations

import os
from pathlib import Path

from transformers.utils import SAFE_WEIGHTS_INDEX_NAME, SAFE_WEIGHTS_NAME

from data_prep.errors import new_file_mode


class HubFormatResumeMixin:
    def _load_from_checkpoint(self, resume_from_checkpoint, model=None):
        model = self.model if model is None else model
        full_weights = any(os.path.isfile(os.path.join(resume_from_checkpoint, name))
                           for name in (SAFE_WEIGHTS_NAME, SAFE_WEIGHTS_INDEX_NAME))
        if not full_weights or self.is_fsdp_enabled or hasattr(model, "peft_config"):
            return super()._load_from_checkpoint(resume_from_checkpoint, model)
        loaded = type(model).from_pretrained(resume_from_checkpoint, dtype=model.dtype)
        model.load_state_dict(loaded.state_dict(), strict=True)
        del loaded

    def _save(self, output_dir=None, state_dict=None):
        super()._save(output_dir, state_dict)
        folder = Path(output_dir or self.args.output_dir)
        if self.args.should_save and folder.is_dir():
            for path in folder.glob("*.safetensors"):
                os.chmod(path, new_file_mode())
