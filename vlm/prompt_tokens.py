"""How many tokens a prompt takes, images included, without processing its images: what training (how much of each
answer `max_length` keeps) and the vllm backend (whether `--max-model-len` can hold any prompt) check before the
expensive part starts.

A processor turns each image placeholder of the text into a number of tokens that depends on the image's size
only (Qwen's dynamic resolution; Gemma 3's fixed square). `ImageTokens` measures that number once per size, with
the processor itself on a blank image of that size, so it holds for every family without a table of formulas;
`image_size` reads the size from the file's header (and its EXIF orientation, which the datasets library applies).
"""

from __future__ import annotations

from pathlib import Path


def image_size(image) -> tuple[int, int]:
    """(width, height) of a PIL image, a path, or a datasets `Image(decode=False)` value, as it will be decoded."""
    from PIL import Image

    if isinstance(image, dict):  # {"path", "bytes"} of an undecoded datasets Image
        if image.get("bytes") is not None:
            import io

            image = io.BytesIO(image["bytes"])
        else:
            image = image["path"]
    if isinstance(image, (str, Path)) or hasattr(image, "read"):
        with Image.open(image) as opened:  # reads the header only
            width, height = opened.size
            turned = opened.getexif().get(Image.ExifTags.Base.Orientation) in (5, 6, 7, 8)
        return (height, width) if turned else (width, height)
    return image.size


class ImageTokens:
    """`counter(size)`: the tokens an image of (width, height) adds to a prompt beyond its placeholder's own."""

    def __init__(self, processor):
        self.processor, self.cache = processor, {}
        messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "x"}]}]
        self.text = processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        self.placeholder = text_tokens(processor, [self.text])[0]

    def __call__(self, size) -> int:
        size = tuple(size)
        if size not in self.cache:
            from PIL import Image

            blank = Image.new("RGB", size)
            ids = self.processor(text=[self.text], images=[[blank]], add_special_tokens=False)["input_ids"][0]
            self.cache[size] = len(ids) - self.placeholder
        return self.cache[size]


def text_tokens(processor, texts: list[str]) -> list[int]:
    """Token counts of texts (placeholders unexpanded), as the collators tokenize them (no special tokens added)."""
    tokenizer = getattr(processor, "tokenizer", processor)
    return [len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]] if texts else []
