"""DPO and NCA on SPY-Tune: one script, the recipe's `loss_type` decides (`sigmoid` = DPO, `nca_pair` = NCA).

    accelerate launch --config_file accelerate_configs/zero2.yaml train/dpo.py recipes/dpo.yaml [--key value ...]
    accelerate launch --config_file accelerate_configs/zero2.yaml train/dpo.py recipes/nca.yaml

TRL's DPOTrainer computes the loss; our subclass adds shared vision encoding (`shared_vision`, on by default)
and precomputed reference log-probabilities for vision data (`precompute_ref_log_probs`).
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run as a file by accelerate

from trl import ModelConfig, get_peft_config  # noqa: E402

from losses.vision_dpo_trainer import VisionDPOConfig, VisionDPOTrainer  # noqa: E402
from train.card import attach, finish  # noqa: E402
from train.common import (  # noqa: E402
    SpyTuneArguments,
    check_run,
    load_datasets,
    load_model_and_processor,
    option_error,
    parse_recipe,
    resume_checkpoint,
    run,
)

METHODS = {"sigmoid": "dpo", "nca_pair": "nca"}


def main():
    # args
    script_args, training_args, model_args = parse_recipe(SpyTuneArguments, VisionDPOConfig, ModelConfig)
    if len(training_args.loss_type) != 1 or training_args.loss_type[0] not in METHODS:
        raise option_error("loss_type", f"expected one of {sorted(METHODS)}, got {training_args.loss_type}")
    method = METHODS[training_args.loss_type[0]]
    check_run(script_args, training_args, model_args)
    # data, all of it checked before the model loads
    train_dataset, eval_dataset = load_datasets(method, script_args, training_args)
    # model
    model, processor = load_model_and_processor(model_args, script_args, training_args)
    # trainer
    trainer = VisionDPOTrainer(
        model=model,
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        processing_class=processor,
        peft_config=get_peft_config(model_args),
    )
    attach(trainer, method, script_args, training_args, model_args)
    trainer.train(resume_from_checkpoint=resume_checkpoint(training_args))
    # save / push
    finish(trainer, method, script_args, training_args, model_args)


if __name__ == "__main__":
    run(main)
