"""NCA-P on SPY-Tune: the NCA loss on the non-private and the private variant of each example, summed.

    accelerate launch --config_file accelerate_configs/zero2.yaml train/nca_p.py recipes/nca_p.yaml [--key value ...]

Each example holds both instruction variants of one (image, question, context) with their chosen and rejected
answers: four sequences through the policy and the reference model (losses/nca_p_trainer.py).
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run as a file by accelerate

from trl import ModelConfig, get_peft_config  # noqa: E402

from losses.nca_p_trainer import NCAPConfig, NCAPTrainer  # noqa: E402
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


def main():
    # args
    script_args, training_args, model_args = parse_recipe(SpyTuneArguments, NCAPConfig, ModelConfig)
    check_run(script_args, training_args, model_args)
    # data, all of it checked before the model loads
    train_dataset, eval_dataset = load_datasets("nca_p", script_args, training_args)
    # model
    model, processor = load_model_and_processor(model_args, script_args, training_args)
    # trainer
    trainer = NCAPTrainer(
        model=model,
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        processing_class=processor,
        peft_config=get_peft_config(model_args),
    )
    attach(trainer, "nca_p", script_args, training_args, model_args)
    trainer.train(resume_from_checkpoint=resume_checkpoint(training_args))
    # save / push
    finish(trainer, "nca_p", script_args, training_args, model_args)


if __name__ == "__main__":
    run(main)
