"""Privacy measured while training, and the run's curves beside its model.

`PrivacyEval` (a TrainerCallback, on when the recipe names `eval_privacy_items`): every `eval_steps` (else
`logging_steps`) and at the last step, the model being trained answers a held-out SPY-Bench slice (the first
`eval_privacy_limit` samples, with the training's distractor setting), the offline rule judge judges them, and ICS
and HMS are logged as `eval_privacy_ics` / `eval_privacy_hms` the way the Trainer logs its eval metrics: the console,
W&B, trainer_state.json's log_history (so train_metrics.json). The answers come from the evaluation's own code
(eval/spy/cli.py generate / judge / metrics) and its transformers backend's batching, greedy decoding and prompt, so
the value at the last step is the one `eval spy` (or `eval suite`) gives for the saved model on the same slice.
Off in the paper's recipes (an evaluation costs generation time), on in the demo's.

Generation runs on the first process only, on the unwrapped model (the other processes wait at their next step);
a DeepSpeed ZeRO-3 run, whose weights are sharded, is refused.

`plot_curves`: training_curves.png beside the model at the end of every run (LLaMA-Factory's plot_loss convention):
the loss, the reward (the preference methods' reward margin, GRPO's reward) and the privacy metrics above, by step.
"""

from __future__ import annotations

import logging
import random
import tempfile
from pathlib import Path

import numpy as np
import torch
from transformers import Trainer, TrainerCallback

from eval.backends import HFGenerator

logger = logging.getLogger(__name__)
METRICS = {"ics": "eval_privacy_ics", "hms": "eval_privacy_hms"}
CURVES = "training_curves.png"


class LiveGenerator(HFGenerator):
    """The evaluation's transformers backend on the model being trained (no second copy of the weights)."""

    def __init__(self, model, processor, batch_size: int, max_new_tokens: int):
        self.name = str(getattr(model.config, "_name_or_path", "") or "model in training")
        self.model, self.processor = model, processor
        self.batch_size, self.max_new_tokens = batch_size, max_new_tokens
        self.device, self.dtype = model.device, str(model.dtype).removeprefix("torch.")

    def close(self) -> None:  # the trainer's model: kept
        pass


def privacy_scores(generator, items, images, limit: int | None, distractors: bool, categories=None) -> dict:
    """ICS and HMS of `generator`'s answers to the first `limit` samples of `items`, judged by the rule judge."""
    from eval.spy.cli import generate, judge, metrics

    with tempfile.TemporaryDirectory(prefix="privacy-eval-") as work:
        run, judged = Path(work) / "generate.jsonl", Path(work) / "judged.jsonl"
        generate(items, images, run, generator=generator, distractors=distractors, limit=limit, progress=False,
                 categories=categories)
        judge(run, judged, rule=True, progress=False, categories=categories)
        result = metrics(judged, categories=categories)
    return {key: result[key] for key in METRICS}


class PrivacyEval(TrainerCallback):
    def __init__(self, trainer, script_args, every: int):
        self.trainer, self.script_args, self.every = trainer, script_args, every

    def on_step_end(self, args, state, control, **kwargs):
        step = state.global_step
        if step % self.every == 0 or step == state.max_steps:
            self.evaluate(state)

    def evaluate(self, state) -> None:
        trainer, script = self.trainer, self.script_args
        if trainer.is_world_process_zero():
            model = trainer.accelerator.unwrap_model(trainer.model)
            processor = trainer.processing_class
            tokenizer = getattr(processor, "tokenizer", processor)
            side, training = tokenizer.padding_side, model.training
            tokenizer.padding_side = "left"  # generation pads on the left; training's collator keeps its own side
            model.eval()
            python_rng, numpy_rng = random.getstate(), np.random.get_state()
            try:  # the training after an evaluation is the training without one: every random state put back
                devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
                with torch.random.fork_rng(devices=devices):
                    generator = LiveGenerator(model, processor, trainer.args.per_device_eval_batch_size,
                                              script.eval_privacy_max_new_tokens)
                    scores = privacy_scores(generator, script.eval_privacy_items, script.eval_privacy_images,
                                            script.eval_privacy_limit, script.add_distractors, script.categories)
            finally:
                random.setstate(python_rng)
                np.random.set_state(numpy_rng)
                tokenizer.padding_side = side
                model.train(training)
            # the Trainer's own log (not a TRL trainer's, which would flush its running training metrics here)
            Trainer.log(trainer, {METRICS[key]: value for key, value in scores.items()})


def attach(trainer, script_args, training_args) -> None:
    """Add `PrivacyEval` when the recipe names a held-out slice, its items checked now (one line, exit 2)."""
    if not script_args.eval_privacy_items:
        return
    from cli.errors import InputError
    from data_prep.spy_bench import build_samples

    if str(getattr(training_args, "deepspeed", None) or "").find("zero3") >= 0:
        raise InputError("command line", None, "eval_privacy_items", "not under DeepSpeed ZeRO-3 (the weights are "
                         "sharded); evaluate the saved model with `privacy-align eval spy` instead")
    images = script_args.eval_privacy_images or str(Path(script_args.eval_privacy_items).parent)
    script_args.eval_privacy_images = images
    build_samples(script_args.eval_privacy_items, images_dir=images, categories=script_args.categories)
    trainer.add_callback(PrivacyEval(trainer, script_args, training_args.eval_steps or training_args.logging_steps))


def plot_curves(log_history: list[dict], path) -> Path:
    """The run's loss, reward and privacy curves by step into `path` (PNG, written whole or not at all)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [("loss", ["loss"]), ("reward", ["rewards/margins", "reward"]),
              ("privacy (held-out, rule judge)", list(METRICS.values()))]
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 3.8))
    for ax, (title, keys) in zip(axes, panels):
        drawn = False
        for key in keys:
            points = [(e["step"], e[key]) for e in log_history if key in e and e[key] is not None and "step" in e]
            if points:
                ax.plot(*zip(*points), marker="." if len(points) < 30 else None, label=key)
                drawn = True
        ax.set_title(title)
        ax.set_xlabel("step")
        if drawn:
            ax.legend(fontsize=8)
        else:
            ax.text(0.5, 0.5, "not logged by this run", ha="center", va="center", transform=ax.transAxes)
    fig.tight_layout()
    path = Path(path)
    tmp = path.with_name(path.name + ".partial.png")
    fig.savefig(tmp, dpi=100)
    plt.close(fig)
    tmp.replace(path)
    return path
