"""Supervised fine-tuning on SPY-Tune (the paper's SFT baseline, and the demo's warm-up).

    accelerate launch --config_file accelerate_configs/zero2.yaml train/sft.py recipes/sft.yaml [--key value ...]

Rows are prompt-completion pairs, so the loss covers the answer only (completion-only loss); the reference
implementation also trained on the instructions, the question and the image tokens.

`padding_free: true` (which TRL refuses for vision data) puts every sequence of a micro-batch into one row without
padding, each with its own M-RoPE positions (losses/packing.py); the Qwen families only.
"""

import logging
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run as a file by accelerate

from trl import ModelConfig, SFTConfig, SFTTrainer, get_peft_config  # noqa: E402

from losses.checkpointing import HubFormatResumeMixin  # noqa: E402
from losses.packing import PaddingFreeCollator, enable_packing  # noqa: E402
from losses.truncation import check_truncation, refuse_an_empty_batch  # noqa: E402
from train.card import attach, finish  # noqa: E402
from train.common import (  # noqa: E402
    SpyTuneArguments,
    check_run,
    load_datasets,
    load_model_and_processor,
    parse_recipe,
    resume_checkpoint,
    run,
)
from vlm.families import supports_packing  # noqa: E402

logger = logging.getLogger("train.sft")  # a package logger (cli/log.py), run as a file or not


class SpySFTTrainer(HubFormatResumeMixin, SFTTrainer):
    """TRL's SFTTrainer, resuming full fine-tuning with the right weights (losses/checkpointing.py), and padding-free
    on vision data for the families that can pack."""

    def __init__(self, model, args, **kwargs):
        padding_free = args.padding_free and supports_packing(getattr(getattr(model, "config", None), "model_type", None))
        args.padding_free = args.padding_free and not padding_free  # TRL's own check refuses vision data
        super().__init__(model=model, args=args, **kwargs)
        check_truncation(self.train_dataset, self.processing_class, args.max_length,  # what max_length leaves
                         warn=logger.warning if self.is_world_process_zero() else None)
        if padding_free:
            args.padding_free = True
            self.data_collator = PaddingFreeCollator(self.data_collator)
            enable_packing(self.model)  # after TRL's fused head, which it wraps

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if model.training:  # the first label is never predicted (TRL shifts it away)
            refuse_an_empty_batch(inputs["labels"][:, 1:] != -100, self.args.max_length, self.state.global_step)
        return super().compute_loss(model, inputs, return_outputs=return_outputs, num_items_in_batch=num_items_in_batch)


def main():
    # args
    script_args, training_args, model_args = parse_recipe(SpyTuneArguments, SFTConfig, ModelConfig)
    check_run(script_args, training_args, model_args)
    # data, all of it checked before the model loads
    train_dataset, eval_dataset = load_datasets("sft", script_args, training_args)
    # model
    model, processor = load_model_and_processor(model_args, script_args, training_args)
    # trainer
    trainer = SpySFTTrainer(
        model=model,
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        processing_class=processor,
        peft_config=get_peft_config(model_args),
    )
    attach(trainer, "sft", script_args, training_args, model_args)
    trainer.train(resume_from_checkpoint=resume_checkpoint(training_args))
    # save / push
    finish(trainer, "sft", script_args, training_args, model_args)


if __name__ == "__main__":
    run(main)
