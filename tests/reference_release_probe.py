"""Run under `accelerate launch` by test_reference_release.py: builds the NCA-P trainer on the tiny model with a live
and with a precomputed reference and prints how many model objects are alive after each set-up."""

import gc
import sys
from pathlib import Path

from transformers import AutoModelForImageTextToText, AutoProcessor, Qwen2VLForConditionalGeneration

from data_prep.spy_tune import build_dataset
from data_prep.synthetic import build
from losses.nca_p_trainer import NCAPConfig, NCAPTrainer
from train.tiny_model import build_tiny_model

work = Path(sys.argv[1])
model_dir = build_tiny_model(work / "model")
data = build(work / "data", train_per_label=1, test_per_label=0)
dataset = build_dataset("nca_p", data / "train_data.json", data, seed=0, num_samples=4)
for precompute in (False, True):
    args = NCAPConfig(output_dir=str(work / f"out-{precompute}"), use_cpu=True, bf16=False, report_to="none",
                      max_length=None, per_device_train_batch_size=2, precompute_ref_log_probs=precompute,
                      disable_tqdm=True)
    trainer = NCAPTrainer(model=AutoModelForImageTextToText.from_pretrained(model_dir), args=args,
                          train_dataset=dataset, processing_class=AutoProcessor.from_pretrained(model_dir))
    gc.collect()
    alive = sum(issubclass(type(o), Qwen2VLForConditionalGeneration) for o in gc.get_objects())
    print(f"RESULT precompute={precompute} deepspeed={trainer.is_deepspeed_enabled} live_models={alive}", flush=True)
    del trainer
    gc.collect()
