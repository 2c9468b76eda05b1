"""TRL's DPOTrainer for vision data, with shared vision encoding and precomputed reference log-probabilities.

DPO (`loss_type: sigmoid`) and NCA (`loss_type: nca_pair`) use TRL's own loss code; this subclass changes
only what TRL does not support for vision datasets:

- `shared_vision` (default on): the collator keeps each image once and the backbone encodes it once per model
  per step (losses/shared_vision.py). Families that cannot share (vlm/families.py) train on the plain path,
  with one warning.
- `precompute_ref_log_probs`: TRL refuses it for vision datasets. Here one pass before training stores the
  reference log-probabilities in a column `ref_logps`, cached on disk under `<output_dir>/ref_logps/` keyed by the
  reference weights, the data and the rows scored, and the reference model is released: dropped from the trainer
  and from the accelerator's model list, so that its memory really goes back. A run whose `max_steps` reads part
  of the training set scores only the rows it reads (`rows_read`: the sampler's own order and seed); the others
  hold NaN, and a step that would train on one stops the run rather than train on it.
- `packed` (default on): each example's shared prompt goes through the language model once, all examples of a
  micro-batch in one padding-free row (losses/packing.py); it encodes each image once, as `shared_vision` does.
  Families that cannot pack train unpacked, with one warning. `packed_attention` (auto / flex / sdpa) chooses the
  packed row's attention (losses/packing.py: `PackedAttention`), one object shared by the policy and the reference.
"""

from __future__ import annotations

import contextlib
import gc
import os
from dataclasses import dataclass, field

import torch
from accelerate.utils import is_peft_model
from datasets import Dataset, concatenate_datasets
from datasets.fingerprint import Hasher
from torch.utils.data import DataLoader
from tqdm.auto import tqdm
from transformers.data.data_collator import DataCollatorMixin
from transformers.utils import logging
from trl import DPOConfig, DPOTrainer
from trl.models import prepare_deepspeed
from trl.models.utils import disable_gradient_checkpointing
from trl.trainer.dpo_trainer import DataCollatorForVisionPreference
from trl.trainer.utils import use_adapter

from cli.errors import RunStopped
from losses.checkpointing import HubFormatResumeMixin
from losses.fingerprint import weights_fingerprint
from losses.packing import (
    PACKED_ATTENTION_CHOICES,
    PackedAttention,
    enable_packing,
    pack_preference_batch,
    packed_attention_field,
)
from losses.shared_vision import enable_shared_vision, share_images
from losses.truncation import check_truncation, refuse_an_empty_batch
from vlm.families import supports_packing, supports_shared_vision

logger = logging.get_logger(__name__)

# Batch entries that are not model inputs.
NON_MODEL_KEYS = {"completion_mask", "ref_chosen_logps", "ref_rejected_logps", "ref_logps"}


@dataclass
class VisionDPOConfig(DPOConfig):
    shared_vision: bool = field(
        default=True,
        metadata={"help": "Encode each image once per model per step and reuse it in all sequences of its example."},
    )
    packed: bool = field(
        default=True,
        metadata={"help": "Tree-pack each micro-batch into one padding-free row: every example's shared prompt "
                          "through the language model once (losses/packing.py)."},
    )
    packed_attention: str = packed_attention_field()

    def __post_init__(self):
        super().__post_init__()
        if self.packed_attention not in PACKED_ATTENTION_CHOICES:
            raise ValueError(f"packed_attention must be one of {', '.join(PACKED_ATTENTION_CHOICES)}, "
                             f"got {self.packed_attention!r}")


@dataclass
class PreferenceCollator(DataCollatorMixin):
    """TRL's vision preference collator, plus shared images and the precomputed reference log-probabilities.

    Subclasses change how an example becomes preference pairs (`preference_pairs`) and where the reference
    values go (`add_reference`); `sequences_per_example` is the number of rows (and image copies) per example.
    """

    processor: object
    shared_vision: bool = True
    packed: bool = False
    max_length: int | None = None
    return_tensors: str = "pt"
    sequences_per_example = 2  # TRL's layout: [chosen rows; rejected rows]

    def preference_pairs(self, examples: list[dict]) -> list[dict]:
        return examples

    def add_reference(self, batch: dict, ref: torch.Tensor) -> None:
        batch["ref_chosen_logps"], batch["ref_rejected_logps"] = ref[:, 0], ref[:, 1]

    def torch_call(self, examples: list[dict]) -> dict:
        ref = [example.pop("ref_logps") for example in examples] if "ref_logps" in examples[0] else None
        batch = DataCollatorForVisionPreference(self.processor, max_length=self.max_length)(
            self.preference_pairs(examples))
        if self.packed:
            batch = pack_preference_batch(batch, self.sequences_per_example)
        elif self.shared_vision:
            batch = share_images(batch, repeats=self.sequences_per_example)
        if ref is not None:
            self.add_reference(batch, torch.tensor(ref, dtype=torch.float32))
        return batch


class VisionDPOTrainer(HubFormatResumeMixin, DPOTrainer):
    """DPOTrainer + shared vision encoding + vision-data reference precompute (+ a resume fix)."""

    signature_columns = ["prompt", "chosen", "rejected", "images", "image", "ref_logps"]
    collator_class = PreferenceCollator

    def __init__(self, model, ref_model=None, args: VisionDPOConfig | None = None, data_collator=None,
                 processing_class=None, **kwargs):
        precompute = args.precompute_ref_log_probs
        args.precompute_ref_log_probs = False  # TRL refuses it for vision data; done below instead
        model_type = getattr(getattr(model, "config", None), "model_type", None)
        unshared = args.shared_vision and not supports_shared_vision(model_type)
        if unshared:  # the card's recipe then records what ran
            args.shared_vision = False
        unpacked = args.packed and not supports_packing(model_type)
        if unpacked:
            args.packed = False
        if data_collator is None:
            data_collator = self.collator_class(processing_class, shared_vision=args.shared_vision,
                                                packed=args.packed, max_length=args.max_length)
        super().__init__(model, ref_model=ref_model, args=args, data_collator=data_collator,
                         processing_class=processing_class, **kwargs)
        args.precompute_ref_log_probs = precompute
        if unshared and self.is_world_process_zero():
            logger.warning(f"shared_vision: {model_type} cannot share one image encoding between sequences; "
                           "training on the plain path (every sequence encodes its image)")
        if unpacked and self.is_world_process_zero():
            logger.warning(f"packed: {model_type} cannot take tree-packed batches; training unpacked")
        self.packed_attention = PackedAttention(args.packed_attention)  # the masks shared by policy and reference
        for m in (self.model, self.ref_model):
            if m is not None and args.packed:
                enable_packing(m, self.packed_attention)  # after TRL's fused head, which it wraps
            elif m is not None and args.shared_vision:
                enable_shared_vision(m)
        # before the reference pass: what max_length leaves of the answers, said once; nothing left is refused
        pairs = getattr(self.data_collator, "preference_pairs", None)
        check_truncation(self.train_dataset, processing_class, args.max_length,
                         (lambda example: pairs([example])) if pairs else (lambda example: [example]),
                         warn=logger.warning if self.is_world_process_zero() else None)
        if precompute:
            self._precompute_model_hash = weights_fingerprint(self.ref_model or self.model)
            self.train_dataset = self._precompute_ref_logps(self.train_dataset, "train",
                                                            args.precompute_ref_batch_size or
                                                            args.per_device_train_batch_size, self.rows_read())
            if self.eval_dataset is not None:
                self.eval_dataset = self._precompute_ref_logps(self.eval_dataset, "eval",
                                                               args.precompute_ref_batch_size or
                                                               args.per_device_eval_batch_size)
            self.precompute_ref_logps = True
            self._release_reference()

    def _release_reference(self) -> None:
        """Free the reference model (and the precompute's inference engine): the cache replaces them.

        `accelerator.prepare_model` has registered the reference in `accelerator._models`; while it is listed
        there, dropping the trainer's attribute frees nothing (15 GiB of bf16 weights for a 7B model).
        """
        released = {id(m) for m in (self.ref_model, self._precompute_engine) if m is not None}
        self.accelerator._models[:] = [m for m in self.accelerator._models if id(m) not in released]
        self.ref_model = self._precompute_engine = None
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        # NaN: a row the precompute did not score (rows_read). Checked here, not in the collator: the dataloader
        # collates one batch ahead of the last step, which is never trained on.
        ref = [inputs[k] for k in ("ref_chosen_logps", "ref_rejected_logps", "ref_logps") if k in inputs]
        if any(torch.isnan(values).any() for values in ref):
            raise RunStopped("a training batch holds a row whose reference log-probabilities were not precomputed "
                             "(the sampler read rows other than those rows_read predicted); run again with "
                             "--precompute_ref_log_probs false")
        if model.training:
            refuse_an_empty_batch(inputs["completion_mask"], self.args.max_length, self.state.global_step)
        return super().compute_loss(model, inputs, return_outputs=return_outputs,
                                    num_items_in_batch=num_items_in_batch)

    def _set_signature_columns_if_needed(self):
        if self._signature_columns is None:
            self._signature_columns = list(self.signature_columns)

    def _reference_context(self):
        """Full fine-tuning: a separate reference model. PEFT: the policy with its adapter disabled."""
        if self.ref_model is None and is_peft_model(self.model):
            unwrapped = self.accelerator.unwrap_model(self.model)
            return use_adapter(unwrapped, adapter_name="ref" if "ref" in unwrapped.peft_config else None)
        return contextlib.nullcontext()

    def sequence_logps(self, model, inputs) -> torch.Tensor:
        """Summed completion log-probability of every row of a collated batch, shape (rows,)."""
        model_kwargs = {k: v for k, v in inputs.items() if k not in NON_MODEL_KEYS}
        model_kwargs["use_cache"] = False
        labels = inputs["input_ids"].masked_fill(inputs["completion_mask"] == 0, -100)
        outputs = model(**model_kwargs, labels=labels, fused_lm_head=True)
        seq_len = inputs["completion_mask"].size(1) - 1
        return outputs.log_probs[:, -seq_len:].sum(dim=1)

    def reference_logps(self, inputs, model=None) -> torch.Tensor:
        with (torch.no_grad(), disable_gradient_checkpointing(self.model, self.args.activation_checkpointing_kwargs),
              self._reference_context()):
            return self.sequence_logps(model or self.ref_model or self.model, inputs)

    def rows_read(self) -> list[int] | None:
        """The training rows that `max_steps` reads, in the sampler's order (None: every row). The Trainer's random
        sampler becomes accelerate's seedable one, whose first epoch is `randperm(n)` under the data seed (else
        the training seed, which the Trainer sets before it builds the sampler); the first max_steps x batch x
        gradient accumulation x processes indices are read, shared out between the processes batch by batch."""
        args, dataset = self.args, self.train_dataset
        if args.max_steps is None or args.max_steps <= 0 or dataset is None or not hasattr(dataset, "__len__"):
            return None
        wanted = args.max_steps * args.per_device_train_batch_size * args.gradient_accumulation_steps * \
            max(1, args.world_size)
        n = len(dataset)
        if wanted >= n:  # the whole first epoch
            return None
        strategy = getattr(args, "train_sampling_strategy", "random")
        if strategy == "sequential":
            return list(range(wanted))
        seedable = self.accelerator.dataloader_config.use_seedable_sampler
        if strategy != "random" or not seedable:  # an order known only once the run draws it: score every row
            return None
        seed = args.data_seed if args.data_seed is not None else args.seed
        return torch.randperm(n, generator=torch.Generator().manual_seed(seed))[:wanted].tolist()

    def _precompute_ref_logps(self, dataset: Dataset, name: str, batch_size: int,
                              rows: list[int] | None = None) -> Dataset:
        """One reference pass over `dataset` (or its `rows` only; the others get NaN); adds the column `ref_logps`
        (one value per sequence of a row)."""
        scored = dataset if rows is None else dataset.select(sorted(rows))
        fingerprint = Hasher.hash((dataset._fingerprint, self._precompute_model_hash, type(self).__name__,
                                   None if rows is None else sorted(rows)))
        cache_dir = os.path.join(self.args.output_dir, "ref_logps")
        cache_file = os.path.join(cache_dir, f"{name}-{fingerprint}.parquet")
        if not os.path.exists(cache_file):
            if self.ref_model is None and self.is_deepspeed_enabled:
                # Parameters are not placed yet (the trainer prepares them in `train`): use an inference engine
                self._precompute_engine = self._precompute_engine or prepare_deepspeed(self.model, self.accelerator)
            model = self._precompute_engine or self.ref_model or self.model
            loader = self.accelerator.prepare(DataLoader(scored, batch_size=batch_size, shuffle=False,
                                                         collate_fn=self.data_collator,
                                                         num_workers=self.args.dataloader_num_workers))
            if rows is not None and self.is_world_process_zero():
                logger.info(f"max_steps {self.args.max_steps} reads {len(rows)} of the {len(dataset)} {name} rows: "
                            "precomputing those")
            values = []
            for batch in tqdm(loader, desc=f"Reference log-probs ({name})", disable=not self.is_world_process_zero()):
                logps = self.reference_logps(batch, model)
                per_row = torch.stack(logps.chunk(self.collator_class.sequences_per_example), dim=1)  # (examples, sequences)
                values.append(self.accelerator.gather_for_metrics(per_row).float().cpu())
            values = torch.cat(values).tolist()
            if rows is not None:  # every row of the dataset, NaN where not read
                full = [[float("nan")] * self.collator_class.sequences_per_example for _ in range(len(dataset))]
                for row, value in zip(sorted(rows), values):
                    full[row] = value
                values = full
            if self.accelerator.is_main_process:
                os.makedirs(cache_dir, exist_ok=True)
                tmp = f"{cache_file}.tmp"
                Dataset.from_dict({"ref_logps": values}).to_parquet(tmp)
                os.replace(tmp, cache_file)
            self.accelerator.wait_for_everyone()
        cached = Dataset.from_parquet(cache_file)
        return concatenate_datasets([dataset, cached], axis=1)
