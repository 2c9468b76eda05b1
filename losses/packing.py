"""Tree-packed, padding-free preference batches: each example's shared prompt goes through the language model once.

An example's rows (DPO / NCA: [prompt + chosen, prompt + rejected]; NCA-P: the two instruction variants, each with
its chosen and rejected answer) become a tree of segments: the prefix that all its distinct prompts share (system
text, image, common text) once, one branch per distinct prompt continuation, one leaf per answer. All examples of
a micro-batch go into one row, without padding. A token attends to the earlier tokens of its own segment and to
every segment on its path to the root, never to a sibling or another example. Because attention is causal and the
positions of a token depend only on the tokens before it, a packed token then has exactly the hidden state it has in
its unpacked sequence, so the log-probabilities, the losses and the gradients are those of the unpacked batch.

- Positions: the model's own rope-index function (M-RoPE for Qwen2-VL / 2.5-VL / 3-VL) runs on the unpacked rows
  (small integer tensors the collator keeps), and each packed token takes the position of the token it was copied
  from.
- Images: each example's images once (`image_index`, losses/shared_vision.py); Qwen3-VL's deepstack features follow
  the image tokens of the packed row.
- Log-probabilities: a completion token is predicted by its predecessor in the tree (the first token of an answer by
  the last token of its prompt, which is in the parent segment), so the backbone returns the hidden states of those
  predecessors only, and TRL's fused head scores exactly the completion tokens. The wrapper then writes the
  per-token values back into the unpacked (rows, length - 1) grid, so TRL's loss code and metrics read them as usual.
- Attention (`packed_attention: auto | flex | sdpa`, `PackedAttention`): sdpa with a boolean (1, 1, T, T) tree mask,
  or torch's flex_attention with a block mask from the segment tree (no dense T x T mask). transformers' own flex
  integration refuses the Qwen-VL classes (`_supports_flex_attn` is False), so flex runs through an attention
  function registered with transformers' `AttentionInterface` ("packed_tree"), which takes our block mask and hands
  every other mask to sdpa. The choice is made per pass: a pass without gradient (the precomputed reference,
  log-prob evaluation, a reference or old-policy pass) may run flex on CPU (eager); a gradient pass runs flex on
  CUDA only (torch has no flex backward on CPU). `auto` runs flex only where it has run for the family (its
  `flex_routes` in vlm/families.py, read by `flex_ran_on()`): nowhere yet, so sdpa. If flex raises on its first
  forward, `auto` warns once and runs sdpa; `flex` set explicitly stops with one line. The masks are built once per
  batch and shared by every model given the same `PackedAttention` (policy and reference); what ran is recorded for
  the card / W&B.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import types
import warnings
import weakref

import torch
from torch.nn.attention.flex_attention import BlockMask, flex_attention

from cli.errors import InputError
from losses.shared_vision import enable_shared_vision, vision_backbone
from vlm.families import flex_ran_on

logger = logging.getLogger(__name__)

IMAGE = 1  # mm_token_type_ids value of image tokens
PACKED_KEYS = ("packed_input_ids", "packed_mm_token_type_ids", "packed_segments", "packed_ancestors",
               "packed_source", "packed_multiplicity", "packed_logp_index", "packed_logp_source",
               "rope_image_grid_thw")


# ---- the layout (collator side, pure tensor functions) -------------------------------------------------------------

def _common_prefix_length(sequences: list[list[int]]) -> int:
    length = min(len(s) for s in sequences)
    for i in range(length):
        if any(s[i] != sequences[0][i] for s in sequences[1:]):
            return i
    return length


def example_tree(prompts: list[list[int]]) -> tuple[int, list[int], list[int]]:
    """(prefix length, distinct prompts as indices into `prompts`, branch of every prompt) for one example's rows."""
    distinct, branch_of = [], []
    for prompt in prompts:
        for k, d in enumerate(distinct):
            if prompts[d] == prompt:
                branch_of.append(k)
                break
        else:
            branch_of.append(len(distinct))
            distinct.append(len(branch_of) - 1)
    return _common_prefix_length([prompts[d] for d in distinct]), distinct, branch_of


def pack_preference_batch(batch: dict, sequences_per_example: int) -> dict:
    """Pack a batch collated by TRL's vision preference collator (every row with its images, right-padded after
    `flush_left`) into one padding-free tree-packed row; the unpacked integer tensors stay for positions and for
    TRL's bookkeeping (`input_ids`, `attention_mask`, `completion_mask`, which the model no longer reads).

    Rows are in blocks of the examples: row r belongs to example r % (rows / sequences_per_example).
    """
    input_ids, attention, completion = batch["input_ids"], batch["attention_mask"], batch["completion_mask"]
    if "mm_token_type_ids" not in batch:
        raise ValueError("packing needs mm_token_type_ids (the Qwen-VL processors' image token map)")
    mm_types = batch["mm_token_type_ids"]
    rows, length = input_ids.shape
    if rows % sequences_per_example:
        raise ValueError(f"{rows} rows do not split into examples of {sequences_per_example} sequences")
    examples = rows // sequences_per_example
    ids, types_, real, answer = (t.tolist() for t in (input_ids, mm_types, attention.bool(), completion.bool()))

    def starts_image(row: int, c: int) -> bool:
        return types_[row][c] == IMAGE and (c == 0 or types_[row][c - 1] != IMAGE)

    # image slots: row by row, one per run of image tokens; slot s shows unique image s % (slots / sequences)
    slot_start, slots = [], 0
    for r in range(rows):
        slot_start.append(slots)
        slots += sum(starts_image(r, c) for c in range(length))
    if slots % sequences_per_example:
        raise ValueError(f"{slots} image slots do not split into {sequences_per_example} identical blocks")
    unique_images = slots // sequences_per_example

    packed_ids, packed_types, segments, source, image_index = [], [], [], [], []
    parents: list[int] = []
    where = [[-1] * length for _ in range(rows)]  # packed index of every real token of every row

    def emit(row: int, columns: range, parent: int) -> int:
        segment = len(parents)
        parents.append(parent)
        images_before = sum(starts_image(row, c) for c in range(columns.start))
        for c in columns:
            if starts_image(row, c):
                image_index.append((slot_start[row] + images_before) % unique_images)
                images_before += 1
            where[row][c] = len(packed_ids)
            packed_ids.append(ids[row][c])
            packed_types.append(types_[row][c])
            segments.append(segment)
            source.append(row * length + c)
        return segment

    logp_index, logp_source = [], []
    for e in range(examples):
        members = [e + k * examples for k in range(sequences_per_example)]
        prompts = []
        for r in members:
            n_real, n_answer = sum(real[r]), sum(answer[r])
            n_prompt = n_real - n_answer
            if not all(real[r][:n_real]) or answer[r] != [False] * n_prompt + [True] * n_answer + [False] * (
                    length - n_real) or n_prompt == 0:
                raise ValueError("packing expects every row as [prompt | completion | padding] (TRL's flush_left)")
            prompts.append(ids[r][:n_prompt])
        prefix, distinct, branch_of = example_tree(prompts)
        root = emit(members[distinct[0]], range(prefix), -1) if prefix else -1
        branches = []
        for d in distinct:
            row = members[d]
            tail = range(prefix, len(prompts[d]))
            branches.append(emit(row, tail, root) if len(tail) else root)
            for c in range(prefix):
                where[row][c] = where[members[distinct[0]]][c]
        for k, row in enumerate(members):
            first = members[distinct[branch_of[k]]]
            for c in range(len(prompts[k])):
                where[row][c] = where[first][c]
            end = len(prompts[k]) + sum(answer[row])
            emit(row, range(len(prompts[k]), end), branches[branch_of[k]])
            for c in range(len(prompts[k]), end):
                logp_index.append(where[row][c - 1])
                logp_source.append(row * length + c)

    multiplicity = [0.0] * len(packed_ids)  # how many unpacked rows hold each packed token
    for r in range(rows):
        for i in where[r]:
            if i >= 0:
                multiplicity[i] += 1
    ancestors = torch.eye(len(parents), dtype=torch.bool)
    for s, parent in enumerate(parents):  # parents come before their children
        if parent >= 0:
            ancestors[s] |= ancestors[parent]
    packed = {k: v for k, v in batch.items() if k not in ("pixel_values", "image_grid_thw")}
    grid = batch["image_grid_thw"]
    patches = int(grid[:unique_images].prod(-1).sum())
    long = functools.partial(torch.tensor, dtype=torch.long)
    packed.update({
        "pixel_values": batch["pixel_values"][:patches], "image_grid_thw": grid[:unique_images],
        "image_index": long(image_index), "rope_image_grid_thw": grid,
        "packed_input_ids": long([packed_ids]), "packed_mm_token_type_ids": long([packed_types]),
        "packed_segments": long(segments), "packed_ancestors": ancestors, "packed_source": long(source),
        "packed_multiplicity": torch.tensor([multiplicity]),
        "packed_logp_index": long(logp_index), "packed_logp_source": long(logp_source),
    })
    return packed


def dense_mask_bytes(tokens: int) -> int:
    """Peak bytes of the dense tree mask of a packed row of `tokens` tokens: its build (the causal and the ancestor
    (T, T) booleans and their conjunction) and sdpa's float copy of it (float32 at most)."""
    return tokens * tokens * (3 + 4)


def _free_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    import psutil

    return psutil.virtual_memory().available


def check_dense_mask_fits(tokens: int, device: torch.device) -> None:
    """Refuse, before building it, a dense mask that would take more than half the free memory of its device."""
    need, free = dense_mask_bytes(tokens), _free_bytes(device)
    if need > free // 2:
        raise InputError("recipe", None, "per_device_train_batch_size", (
            f"a packed micro-batch of {tokens} tokens needs {need / 2**30:.1f} GiB for its dense tree attention "
            f"mask, more than half the free {device.type} memory ({free / 2**30:.1f} GiB): lower "
            "per_device_train_batch_size (the precompute pass: precompute_ref_batch_size; evaluation: "
            "per_device_eval_batch_size)"))


def tree_attention_mask(segments: torch.Tensor, ancestors: torch.Tensor) -> torch.Tensor:
    """(1, 1, T, T) boolean mask, True where query i may attend key j: j <= i and j's segment is on i's path."""
    check_dense_mask_fits(segments.numel(), ancestors.device)
    positions = torch.arange(segments.numel(), device=ancestors.device)
    causal = positions[None, :] <= positions[:, None]
    return (causal & ancestors[segments[:, None], segments[None, :]])[None, None]


def tree_block_mask(segments: torch.Tensor, ancestors: torch.Tensor):
    """The same mask as a flex_attention BlockMask: only the (128 x 128) blocks that any query attends are kept."""
    from torch.nn.attention.flex_attention import create_block_mask

    def tree(b, h, q, kv):
        return (kv <= q) & ancestors[segments[q], segments[kv]]

    n = segments.numel()
    return create_block_mask(tree, B=None, H=None, Q_LEN=n, KV_LEN=n, device=ancestors.device)


# ---- the attention ---------------------------------------------------------------------------------------------------

ATTENTION = "packed_tree"  # the name our attention function is registered under (not "flex_attention": refused)
PACKED_ATTENTION_CHOICES = ("auto", "flex", "sdpa")


@functools.lru_cache(maxsize=1)
def _compiled_flex():
    # torch.compile's defaults: a packed row's length changes every batch, and a second length makes it compile
    # for dynamic lengths instead of once per length (not run on a GPU yet)
    return torch.compile(flex_attention)


def packed_tree_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """transformers' attention-function signature: flex_attention with our block mask, sdpa for any other mask.
    On CUDA flex is compiled (eager flex materialises the full scores); on CPU it runs eager (compiling takes
    ~86 s), where torch's warning about the unfused implementation is expected and silenced."""
    if not isinstance(attention_mask, BlockMask):
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout,
                                      **kwargs)
    if dropout:
        raise ValueError("the flex route has no attention dropout")
    gqa = query.shape[1] != key.shape[1]
    if query.device.type == "cuda":
        out = _compiled_flex()(query, key, value, block_mask=attention_mask, scale=scaling, enable_gqa=gqa)
    else:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
            out = flex_attention(query, key, value, block_mask=attention_mask, scale=scaling, enable_gqa=gqa)
    return out.transpose(1, 2).contiguous(), None


@functools.lru_cache(maxsize=1)
def register_packed_attention() -> None:
    """Register "packed_tree" with transformers (its unpacked forwards get sdpa's mask and sdpa)."""
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.masking_utils import sdpa_mask

    AttentionInterface.register(ATTENTION, packed_tree_attention)
    AttentionMaskInterface.register(ATTENTION, sdpa_mask)


def packed_attention_field():
    """The recipe key `packed_attention`, one definition for every trainer that packs (DPO / NCA / NCA-P, GRPO)."""
    return dataclasses.field(default="auto", metadata={
        "help": "The packed row's attention: `sdpa` (a boolean tree mask), `flex` (flex_attention with a block mask; "
                "on CPU for passes without gradient only; fails the run if flex fails) or `auto` (flex only where it "
                "has run for the family, vlm/families.py; else sdpa; if flex fails, one warning and sdpa).",
        "choices": list(PACKED_ATTENTION_CHOICES)})


class PackedAttention:
    """Which attention each packed pass runs, the masks of the current batch, and what ran.

    One object per trainer, given to every model it packs (policy, reference; GRPO's old policy): the masks of a
    batch are built once (keyed by the batch's segment tensor) and shared. `requested` is the recipe's
    `packed_attention`. `ran` maps "gradient" / "no_gradient" to the attention those passes ran.
    """

    def __init__(self, requested: str = "auto"):
        if requested not in PACKED_ATTENTION_CHOICES:
            raise ValueError(f"packed_attention must be one of {', '.join(PACKED_ATTENTION_CHOICES)}, got {requested!r}")
        self.requested = requested
        self.ran: dict[str, str] = {}
        self.fallback: str | None = None  # why flex was given up, when it was
        self.flex_proven = False
        self.forced: str | None = None  # `only`: every pass on one kernel (side-by-side checks)
        self._key, self._masks = None, {}

    @contextlib.contextmanager
    def only(self, kind: str):
        """Run every pass on `kind` ("flex" or "sdpa") inside the block, e.g. to compare the two on one batch (flex:
        on models packed with `packed_attention: flex`, whose attention is the registered "packed_tree")."""
        self.forced = kind
        try:
            yield self
        finally:
            self.forced = None

    def may_use_flex(self, model_type: str | None) -> bool:
        return self.requested == "flex" or (self.requested == "auto" and bool(flex_ran_on(model_type)))

    def choose(self, model_type: str | None, device_type: str, gradient: bool) -> str:
        """"flex" or "sdpa" for one pass."""
        if self.forced is not None:
            return self.forced
        if self.fallback is not None or self.requested == "sdpa":
            return "sdpa"
        if self.requested == "auto":
            return "flex" if (device_type, "gradient" if gradient else "no_gradient") in flex_ran_on(model_type) else "sdpa"
        return "sdpa" if device_type == "cpu" and gradient else "flex"  # torch has no flex backward on CPU

    def mask(self, kind: str, segments: torch.Tensor, ancestors: torch.Tensor):
        # Held only while the batch is: a mask is T x T booleans (256 MB at 16k tokens), and keeping the last
        # batch's until the next one is built would double the peak and outlive the reference precompute.
        if self._key is None or self._key() is not segments:
            self._masks = {}
            self._key = weakref.ref(segments, lambda _, masks=self._masks: masks.clear())
        if kind not in self._masks:
            self._masks[kind] = (tree_block_mask if kind == "flex" else tree_attention_mask)(segments, ancestors)
        return self._masks[kind]

    def flex_failed(self, err: Exception) -> None:
        reason = f"{type(err).__name__}: {str(err).strip().splitlines()[0] if str(err).strip() else ''}".rstrip(": ")
        if self.requested == "flex":
            raise InputError("recipe", None, "packed_attention", f"flex failed on the first packed forward ({reason}); "
                             "packed_attention: auto or sdpa runs sdpa with the boolean tree mask") from None
        self.fallback = reason
        logger.warning("packed_attention: flex_attention failed on the first packed forward (%s); "
                       "continuing on sdpa with the boolean tree mask", reason)

    def record(self, gradient: bool, kind: str) -> None:
        name = "gradient" if gradient else "no_gradient"
        label = {"flex": "flex_attention (block mask)", "sdpa": "sdpa (boolean tree mask)"}[kind]
        if self.ran.get(name) != label:
            self.ran[name] = label
            logger.info("packed attention, %s passes: %s", name.replace("_", "-"), label)

    def summary(self) -> dict:
        """What ran, for the card and the W&B config."""
        return {"requested": self.requested, **self.ran, **({"flex_failed": self.fallback} if self.fallback else {})}


DEFAULT_ATTENTION = PackedAttention()  # for callers that pass none (SFT padding-free): sdpa


def attention_ran(model) -> dict | None:
    """What a packed model's passes ran (PackedAttention.summary), None if it never ran packed."""
    state = getattr(_top(model), "_packed_attention", None)
    return state.summary() if state is not None and state.ran else None


# ---- the model side -------------------------------------------------------------------------------------------------

class PackedTreeMixin:
    """Mixed into the backbone class (after SharedImagesMixin): attends through `tree_mask` and returns only the
    hidden states at `gather_index`. (`attention_mask` then holds each packed token's multiplicity, which is what
    TRL's fused head hands to an MoE load-balancing loss: the unpacked batch's token weights.)"""

    def forward(self, *args, gather_index: torch.Tensor | None = None, tree_mask=None, **kwargs):
        if tree_mask is not None:
            kwargs["attention_mask"] = tree_mask
        outputs = super().forward(*args, **kwargs)
        if gather_index is not None:
            outputs.last_hidden_state = outputs.last_hidden_state[:, gather_index]
        return outputs


def packed_positions(backbone, batch: dict) -> torch.Tensor:
    """(3, 1, T) positions: the model's rope index of the unpacked rows, gathered onto the packed tokens."""
    positions, _ = backbone.get_rope_index(input_ids=batch["input_ids"], mm_token_type_ids=batch["mm_token_type_ids"],
                                           image_grid_thw=batch["rope_image_grid_thw"],
                                           attention_mask=batch["attention_mask"])
    return positions.flatten(1)[:, batch["packed_source"]][:, None]


def _top(model):
    top = getattr(model, "module", model)  # DDP / DeepSpeed engine (TRL prepares a ZeRO-3 reference at once)
    return top.get_base_model() if hasattr(top, "get_base_model") else top


def enable_packing(model, attention: PackedAttention | None = None) -> None:
    """Let `model` (a TRL-fused-head model: call after `add_fused_lm_head`) take tree-packed batches.

    The wrapped forward recognises a packed batch by its keys, runs the backbone on the packed row and writes the
    per-token outputs of the completion tokens back into the unpacked (rows, length - 1) layout that TRL expects.
    `attention` (one per trainer, shared by its models) chooses sdpa or flex per pass; a pass run under
    `torch.no_grad()` counts as a no-gradient pass.
    """
    enable_shared_vision(model)
    backbone = vision_backbone(model)
    if not isinstance(backbone, PackedTreeMixin):
        backbone.__class__ = type(f"{type(backbone).__name__}Packed", (PackedTreeMixin, type(backbone)), {})
    top = _top(model)
    if getattr(top.forward, "_packed", False):
        return
    attention = attention or DEFAULT_ATTENTION
    top._packed_attention = attention
    model_type = getattr(top.config, "model_type", None)
    if attention.may_use_flex(model_type):
        register_packed_attention()
        top.set_attn_implementation({"text_config": ATTENTION})
    fused_forward = top.forward

    @functools.wraps(type(top).forward)  # keep the signature: `generate` (GRPO's rollouts) checks kwargs against it
    def packed_forward(self, *args, **kwargs):
        if "packed_input_ids" not in kwargs:
            return fused_forward(*args, **kwargs)
        batch = {k: kwargs.pop(k) for k in (*PACKED_KEYS, "input_ids", "attention_mask", "mm_token_type_ids")}
        kwargs.pop("labels", None)
        rows, length = batch["input_ids"].shape
        source = batch["packed_logp_source"]
        labels = batch["input_ids"].flatten()[source]
        segments, ancestors = batch["packed_segments"], batch["packed_ancestors"]
        gradient = torch.is_grad_enabled()
        kind = attention.choose(model_type, segments.device.type, gradient)

        def run(kind):
            return fused_forward(
                input_ids=batch["packed_input_ids"], mm_token_type_ids=batch["packed_mm_token_type_ids"],
                position_ids=packed_positions(vision_backbone(self), batch),
                tree_mask=attention.mask(kind, segments, ancestors), attention_mask=batch["packed_multiplicity"],
                gather_index=batch["packed_logp_index"], shift_labels=labels[None], **kwargs)

        if kind == "flex" and not attention.flex_proven:
            try:
                outputs = run(kind)
                attention.flex_proven = True
            except Exception as err:  # the first flex forward: compile error, dtype, head size, old torch, ...
                attention.flex_failed(err)  # explicit flex: InputError
                kind = "sdpa"
                outputs = run(kind)
        else:
            outputs = run(kind)
        attention.record(gradient, kind)
        target = source - source // length - 1  # (r, c) -> r * (length - 1) + c - 1: where TRL's shift puts it
        for name in ("log_probs", "entropy", "log_sum_sq_probs", "mean_logits", "is_top1"):
            value = getattr(outputs, name, None)
            if value is not None:
                grid = value.new_zeros(rows * (length - 1)).index_put((target,), value[0])
                setattr(outputs, name, grid.view(rows, length - 1))
        outputs.label_mask = torch.zeros(rows * (length - 1), dtype=torch.bool, device=source.device).index_fill(
            0, target, True).view(rows, length - 1)
        return outputs

    packed_forward._packed = True
    top.forward = types.MethodType(packed_forward, top)


class PaddingFreeCollator:
    """SFT without padding: TRL's vision collator, then every sequence of the batch into one row (one root segment
    each: the prompt, with the labelled tokens as its leaf), with each sequence's own (M-RoPE) positions. Labels stay
    in the unpacked layout, for the Trainer's token count; the model scores the same tokens."""

    def __init__(self, collator):
        self.collator = collator

    def __call__(self, examples: list[dict]) -> dict:
        batch = self.collator(examples)
        labelled = batch["labels"] != -100
        labelled[:, 0] = False  # the first token is never predicted (TRL shifts it away)
        batch["completion_mask"] = labelled.long()
        packed = pack_preference_batch(batch, sequences_per_example=1)
        del packed["completion_mask"]
        return packed
