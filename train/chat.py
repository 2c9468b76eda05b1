"""Try a model: one image, your privacy instruction, a question; prints the answer (greedy decoding).

    python -m train.chat --model PATH_OR_ID --image photo.jpg \\
        --instruction "Do not reveal anyone's identity or address." --question "Who lives here?"

The prompt is the one SPY-Bench and training use (the instruction, a blank line, the question, after the
image), so this is the snippet on the model card. A LoRA adapter folder loads on its recorded base.
"""

from __future__ import annotations

import argparse
import sys

from cli.entry import ArgumentParser, run_command
from cli.errors import check_image
from cli.numbers import option


def answer(model_path: str, image: str, instruction: str, question: str, max_new_tokens: int = 256,
           model=None, processor=None) -> str:
    import torch
    from PIL import Image
    from transformers import AutoModelForImageTextToText, AutoProcessor

    processor = processor or AutoProcessor.from_pretrained(model_path)
    model = model or AutoModelForImageTextToText.from_pretrained(model_path)  # an adapter: peft loads its base
    text = f"{instruction}\n\n{question}" if instruction else question
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": text}]}]
    prompt = processor.apply_chat_template(messages, add_generation_prompt=True)
    inputs = processor(text=[prompt], images=[Image.open(image).convert("RGB")], return_tensors="pt").to(model.device)
    with torch.inference_mode():
        output = model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False)
    return processor.decode(output[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True)


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(prog="python -m train.chat", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="model folder, LoRA adapter folder, or Hub id")
    parser.add_argument("--image", required=True)
    parser.add_argument("--instruction", default="", help="the privacy boundary, in plain language")
    parser.add_argument("--question", required=True)
    parser.add_argument("--max-new-tokens", type=option("max_new_tokens"), default=256)
    args = parser.parse_args(argv)
    check_image(args.image)  # before the model loads: a missing, empty, truncated or oversized image names itself
    if args.max_new_tokens < 1:
        print("error: --max-new-tokens must be at least 1", file=sys.stderr)
        return 2
    try:
        text = answer(args.model, args.image, args.instruction, args.question, args.max_new_tokens)
    except OSError as err:  # transformers' word for a model that is not there
        print(f"error: --model {args.model}: {str(err).strip().splitlines()[0] if str(err).strip() else err}",
              file=sys.stderr)
        return 2
    print(text)
    return 0


if __name__ == "__main__":
    run_command(main)
