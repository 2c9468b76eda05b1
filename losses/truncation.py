"""How much of each answer `max_length` keeps, counted on the dataset before training (and the reference pass) starts.

TRL's vision collators put each sequence's prompt (its image tokens included) first and then cut the row at
`max_length`: a short `max_length` cuts answers in half or away entirely, and a step whose answers are all gone
trains on nothing (DPO's loss stays log 2 with a zero gradient), silently. Here the rows are tokenized as the
collators tokenize them (TRL's own chat-template step; the images' token counts from their sizes, by
vlm/prompt_tokens.py, without decoding them), and:

- rows that lose answer tokens are counted and said once, in one warning with the numbers;
- a dataset in which no row keeps an answer token is refused (InputError: one line, exit 2);
- a training batch that keeps no answer token stops the run (RunStopped: one line, exit 1) before its step: where
  only some rows keep nothing, the sampler can still draw a batch of them alone.

Packed and unpacked batches truncate alike (packing takes the collated, already cut rows), so one check holds
for both.
"""

from __future__ import annotations

from dataclasses import dataclass

from cli.errors import InputError, RunStopped


@dataclass
class Truncation:
    rows: int  # training rows (examples)
    cut: int  # rows of which some answer loses tokens
    emptied: int  # rows of which some answer loses every token
    nothing: int  # rows that keep no answer token at all
    longest: int  # tokens of the longest sequence (what max_length must be to cut nothing)
    shortest_prompt: int

    def warning(self, max_length: int) -> str | None:
        if not self.cut:
            return None
        return (f"max_length {max_length} cuts answer tokens from {self.cut} of {self.rows} training rows; in "
                f"{self.emptied} of them an answer loses every token, and {self.nothing} keep no answer token at all "
                f"(they train on nothing); max_length {self.longest} cuts nothing")


def sequences(example: dict, pairs, processor) -> list[tuple[str, str, list]]:
    """(prompt text, answer text, images) of every sequence of one training row, as TRL's collators render them.
    `pairs(example)` turns a row into TRL preference pairs (the NCA-P collator's two per row); SFT rows have a
    `completion`."""
    from trl.data_utils import apply_chat_template, prepare_multimodal_messages

    images = example.get("images") or ([example["image"]] if example.get("image") is not None else [])
    rows = [(("completion",), example)] if "completion" in example else \
        [(("chosen", "rejected"), pair) for pair in pairs(example)]
    out = []
    for sides, row in rows:
        row = {"prompt": row["prompt"], **{side: row[side] for side in sides}}
        if isinstance(row["prompt"], list):  # conversational, as every SPY-Tune row is
            row = {"prompt": prepare_multimodal_messages(row["prompt"], images=images),
                   **{side: prepare_multimodal_messages(row[side]) for side in sides}}
            row = apply_chat_template(row, processor)
        out += [(row["prompt"], row[side], images) for side in sides]
    return out


def token_counts(dataset, processor, pairs=lambda example: [example]):
    """Per training row, the (prompt tokens, answer tokens) of each of its sequences (None: rows of a shape this
    does not know)."""
    from datasets import Image, List

    from vlm.prompt_tokens import ImageTokens, image_size, text_tokens

    columns = set(dataset.column_names)
    if not ({"prompt", "completion"} <= columns or {"chosen", "rejected"} <= columns
            or {"chosen_0", "rejected_0"} <= columns):
        return None
    feature = dataset.features.get("images")
    if isinstance(feature, List) and isinstance(feature.feature, Image):
        dataset = dataset.cast_column("images", List(Image(decode=False)))  # sizes from headers, no decoding
    image_tokens = ImageTokens(processor)

    def rows():
        for example in dataset:
            seqs = sequences(example, pairs, processor)
            prompts = text_tokens(processor, [p for p, _, _ in seqs])
            answers = text_tokens(processor, [a for _, a, _ in seqs])
            yield [(prompt + sum(image_tokens(image_size(image)) for image in images), answer)
                   for (_, _, images), prompt, answer in zip(seqs, prompts, answers)]

    return rows()


def measure(dataset, processor, max_length: int, pairs=lambda example: [example]) -> Truncation | None:
    """Count what `max_length` cuts from the answers of `dataset` (None: rows of a shape this does not know)."""
    counts = token_counts(dataset, processor, pairs)
    if counts is None:
        return None
    rows, cut, emptied, nothing, longest, shortest = 0, 0, 0, 0, 0, None
    for row in counts:
        rows += 1
        kept = [(max(0, min(answer, max_length - prompt)), answer) for prompt, answer in row]
        longest = max(longest, *(prompt + answer for prompt, answer in row))
        shortest = min(prompt for prompt, _ in row) if shortest is None else min(shortest, *(p for p, _ in row))
        cut += any(k < a for k, a in kept)
        emptied += any(k == 0 < a for k, a in kept)
        nothing += all(k == 0 for k, _ in kept)
    return Truncation(rows, cut, emptied, nothing, longest, shortest or 0)


def check_truncation(dataset, processor, max_length: int | None, pairs=lambda example: [example],
                     warn=None) -> Truncation | None:
    """Warn once (through `warn`) when `max_length` cuts answers; InputError when no row keeps an answer token."""
    if max_length is None or dataset is None or not len(dataset):
        return None
    found = measure(dataset, processor, max_length, pairs)
    if found is None:
        return None
    if found.nothing == found.rows:
        raise InputError("training arguments", None, "max_length",
                         f"{max_length} keeps no answer token of any of the {found.rows} training rows (the shortest "
                         f"prompt, its image tokens included, is {found.shortest_prompt} tokens): nothing would be "
                         f"trained; raise it (max_length {found.longest} cuts nothing)")
    if found.cut and warn is not None:
        warn(found.warning(max_length))
    return found


def refuse_an_empty_batch(kept, max_length: int | None, step: int) -> None:
    """RunStopped when `max_length` left no answer token in a training batch (`kept`: its answer-token mask): the
    step's loss would be a constant and its gradient zero, a step that trains on nothing."""
    if not bool(kept.any()):
        raise RunStopped(f"training step {step + 1}: max_length {max_length} leaves no answer token in this batch "
                         "(the warning before training counted the rows it empties), so the step would train on "
                         "nothing; raise max_length")
