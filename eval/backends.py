"""One Generator interface, three backends: transformers (`hf`), vLLM (`vllm`) and any OpenAI-compatible
endpoint (`openai`).

A request is `{"id": str, "messages": [...], "images": [PIL.Image | path]}`; message content is a string or
a list of `{"type": "image"}` / `{"type": "text", "text": ...}` parts, and the k-th image part takes
`images[k]`. Callers put the image part before the text: vLLM's prefix cache then shares the image's
tokens across every sample of one image. `Generator.generate(requests)` yields `{"id", "text"}`, or
`{"id", "text": None, "error"}` for a request that failed for good, once per id, in any order. Decoding
is greedy with at most `max_new_tokens` (512) new tokens.

    gen = load_generator("hf", "Qwen/Qwen2-VL-7B-Instruct", batch_size=16)
    generate_run(gen, requests, "run.jsonl", meta={id: sample_fields})   # resumable

The `openai` backend sends its requests through `data_prep.chat_client.ChatClient`, the one place that talks
to OpenAI-compatible servers (the judge and the data generator use it too).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from pathlib import Path

from data_prep.chat_client import ChatClient, load_image, openai_messages
from data_prep.errors import InputError
from data_prep.families import pixel_kwargs
from data_prep.runs import RunFile, iter_chunks, process_group

logger = logging.getLogger(__name__)

DEFAULT_MAX_NEW_TOKENS = 512


# --------------------------------------------------------------------------------------------------------------
# Requests


def image_parts(messages: list[dict]) -> int:
    """How many `{"type": "image"}` parts the messages hold."""
    return sum(
        1 for m in messages if isinstance(m.get("content"), list) for p in m["content"] if p.get("type") == "image"
    )


def check_requests(requests: list[dict]) -> None:
    """Every request has an id, messages and one image per image part; ids are unique."""
    seen = set()
    for n, request in enumerate(requests, 1):
        if "id" not in request or "messages" not in request:
            raise ValueError(f"request {n}: needs 'id' and 'messages'")
        if request["id"] in seen:
            raise ValueError(f"request {n}: duplicate id {request['id']!r}")
        seen.add(request["id"])
        images = request.get("images") or []
        if image_parts(request["messages"]) != len(images):
            raise ValueError(f"request {request['id']!r}: {image_parts(request['messages'])} image parts "
                             f"but {len(images)} images")


def prompt_length(request: dict) -> int:
    """A cheap proxy of the prompt length, used to batch similar lengths together."""
    return sum(
        len(m["content"]) if isinstance(m["content"], str)
        else sum(len(p.get("text", "")) for p in m["content"])
        for m in request["messages"]
    ) + 1000 * len(request.get("images") or [])


# --------------------------------------------------------------------------------------------------------------
# Generators


class Generator:
    """Base class: `generate(requests)` yields one result per request id."""

    name = "generator"

    def generate(self, requests: list[dict]) -> Iterator[dict]:
        raise NotImplementedError

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class HFGenerator(Generator):
    """transformers `generate`: batched, left padding, greedy; only the new tokens are decoded."""

    def __init__(self, model: str, batch_size: int = 8, max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
                 dtype: str = "auto", device: str = "auto", min_pixels: int | None = None,
                 max_pixels: int | None = None, trust_remote_code: bool = False,
                 attn_implementation: str | None = None):
        import torch
        from transformers import AutoModelForImageTextToText, AutoProcessor

        self.name = str(model)
        self.batch_size, self.max_new_tokens = batch_size, max_new_tokens
        if device == "auto":  # one GPU per process under a multi-process launch
            device = f"cuda:{os.environ.get('LOCAL_RANK', 0)}" if torch.cuda.is_available() else "cpu"
        if dtype == "auto":  # bf16 on GPUs; CPUs run float32 faster than bf16
            dtype = "bfloat16" if device.startswith("cuda") else "float32"
        pixels = pixel_kwargs(model, min_pixels, max_pixels, trust_remote_code=trust_remote_code)
        self.processor = AutoProcessor.from_pretrained(model, trust_remote_code=trust_remote_code, **pixels)
        self.processor.tokenizer.padding_side = "left"
        extra = {"attn_implementation": attn_implementation} if attn_implementation else {}
        self.model = AutoModelForImageTextToText.from_pretrained(
            model, dtype=getattr(torch, dtype), trust_remote_code=trust_remote_code, **extra
        ).to(device).eval()
        self.device = device

    def close(self) -> None:
        """Free the weights (the demo evaluates several checkpoints in one process)."""
        import gc

        import torch

        self.model = None
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    def _generate_batch(self, batch: list[dict], images: list[list]) -> list[str]:
        import torch

        texts = [self.processor.apply_chat_template(r["messages"], tokenize=False, add_generation_prompt=True)
                 for r in batch]
        # One list of images per text: Gemma 3's processor matches them per prompt, Qwen's accept either layout.
        inputs = self.processor(text=texts, images=images if any(images) else None, padding=True, return_tensors="pt")
        inputs = inputs.to(self.device, dtype=self.model.dtype)  # only floating tensors (pixels) are cast
        with torch.inference_mode():
            out = self.model.generate(**inputs, max_new_tokens=self.max_new_tokens, do_sample=False,
                                      temperature=None, top_p=None, top_k=None)
        new_tokens = out[:, inputs["input_ids"].shape[1]:]
        return [t.strip() for t in self.processor.batch_decode(new_tokens, skip_special_tokens=True)]

    def generate(self, requests: list[dict]) -> Iterator[dict]:
        import torch

        check_requests(requests)
        for batch in iter_chunks(sorted(requests, key=prompt_length), self.batch_size):
            ready, images = [], []
            for request in batch:
                try:
                    images.append([load_image(i) for i in request.get("images") or []])
                    ready.append(request)
                except OSError as err:
                    yield {"id": request["id"], "text": None, "error": f"image: {err}"}
            if not ready:
                continue
            try:
                texts = self._generate_batch(ready, images)
            except torch.OutOfMemoryError:
                # One request at a time; a request that still does not fit is recorded, the run goes on.
                torch.cuda.empty_cache()
                for request, request_images in zip(ready, images):
                    try:
                        yield {"id": request["id"], "text": self._generate_batch([request], [request_images])[0]}
                    except torch.OutOfMemoryError as err:
                        torch.cuda.empty_cache()
                        yield {"id": request["id"], "text": None, "error": f"out of memory: {err}"}
                continue
            for request, text in zip(ready, texts):
                yield {"id": request["id"], "text": text}


def vllm_input(processor, request: dict) -> dict:
    """A vLLM prompt: the model's own chat template (no hard-coded prompt table, no silent fallback) and the
    request's images as `multi_modal_data`."""
    prompt = processor.apply_chat_template(request["messages"], tokenize=False, add_generation_prompt=True)
    images = [load_image(i) for i in request.get("images") or []]
    if not images:
        return {"prompt": prompt}
    return {"prompt": prompt, "multi_modal_data": {"image": images[0] if len(images) == 1 else images}}


def image_key(request: dict) -> str:
    images = request.get("images") or []
    return "" if not images else str(images[0]) if isinstance(images[0], (str, Path)) else f"pil-{id(images[0])}"


class VLLMGenerator(Generator):
    """vLLM offline inference (GPU; vLLM lives in its own environment: `make vllm-env`).

    Requests are sorted by image so the samples of one image run together and share its cached prefix,
    and submitted in large chunks (continuous batching inside a chunk; a result file append after each).
    """

    def __init__(self, model: str, max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS, tensor_parallel_size: int = 1,
                 data_parallel_size: int = 1, max_model_len: int | None = 4096, min_pixels: int | None = None, max_pixels: int | None = None,
                 trust_remote_code: bool = False, dtype: str = "auto", seed: int = 0, chunk_size: int = 1024,
                 images_per_prompt: int = 1, gpu_memory_utilization: float = 0.9, **engine_args):
        try:
            import vllm
        except ImportError as err:
            raise RuntimeError(
                "the vllm backend needs vLLM, which pins its own torch/transformers: create its environment with "
                "`make vllm-env` and run this command with .venv-vllm/bin/python (GPU machines only)"
            ) from err
        from transformers import AutoProcessor

        self.name, self.chunk_size = str(model), chunk_size
        self.processor = AutoProcessor.from_pretrained(model, trust_remote_code=trust_remote_code)
        mm_kwargs = pixel_kwargs(model, min_pixels, max_pixels, trust_remote_code=trust_remote_code)
        self.llm = vllm.LLM(
            model=model, tensor_parallel_size=tensor_parallel_size, data_parallel_size=data_parallel_size,
            max_model_len=max_model_len, dtype=dtype,
            seed=seed, trust_remote_code=trust_remote_code, enable_prefix_caching=True,
            limit_mm_per_prompt={"image": images_per_prompt}, gpu_memory_utilization=gpu_memory_utilization,
            **({"mm_processor_kwargs": mm_kwargs} if mm_kwargs else {}), **engine_args,
        )
        self.sampling = vllm.SamplingParams(temperature=0.0, max_tokens=max_new_tokens)

    def close(self) -> None:
        self.llm = None

    def generate(self, requests: list[dict]) -> Iterator[dict]:
        check_requests(requests)
        for chunk in iter_chunks(sorted(requests, key=image_key), self.chunk_size):
            inputs = [vllm_input(self.processor, r) for r in chunk]
            for request, output in zip(chunk, self.llm.generate(inputs, self.sampling, use_tqdm=False)):
                yield {"id": request["id"], "text": output.outputs[0].text.strip()}


class OpenAIGenerator(Generator):
    """Any OpenAI-compatible chat-completions endpoint (OpenAI, a vLLM server, ...), through `ChatClient`."""

    def __init__(self, model: str, base_url: str | None = None, api_key_env: str = "OPENAI_API_KEY",
                 concurrency: int = 8, max_retries: int = 6, timeout: float = 60.0,
                 max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS, **client_options):
        self.name = str(model)
        self.client = ChatClient(model, base_url=base_url, api_key_env=api_key_env, concurrency=concurrency,
                                 max_retries=max_retries, timeout=timeout, max_tokens=max_new_tokens,
                                 **client_options)

    def generate(self, requests: list[dict]) -> Iterator[dict]:
        check_requests(requests)
        # Images are encoded only when a request's turn comes, not all up front.
        jobs = [(r["id"], lambda r=r: openai_messages(r)) for r in requests]
        for request_id, result in self.client.stream(jobs):
            yield {"id": request_id, **result}


BACKENDS: dict[str, type[Generator]] = {"hf": HFGenerator, "vllm": VLLMGenerator, "openai": OpenAIGenerator}


class DataParallel(Generator):
    """Data-parallel generation under N processes (`accelerate launch ... -m eval ...`): the requests go in rounds
    of N x `round_size`; in each round process r generates requests r, r + N, ... and every process receives the
    whole round's results, in request order. So the code after generation is the same in every process, and the
    first process alone writes (data_prep/runs.py); a killed run loses at most the round in flight."""

    def __init__(self, inner: Generator, round_size: int):
        import torch
        from accelerate import PartialState

        PartialState(cpu=not torch.cuda.is_available())  # the process group that gather_object uses
        self.inner, self.round_size, self.name = inner, round_size, getattr(inner, "name", "")

    def close(self) -> None:
        self.inner.close()

    def generate(self, requests: list[dict]) -> Iterator[dict]:
        from accelerate.utils import gather_object

        rank, world = process_group()
        own = 0
        for start in range(0, len(requests), world * self.round_size):
            chunk = requests[start:start + world * self.round_size]
            mine = chunk[rank::world]
            own += len(mine)
            results = gather_object(list(self.inner.generate(mine)) if mine else [])
            position = {str(r["id"]): i for i, r in enumerate(chunk)}
            yield from sorted(results, key=lambda r: position[str(r["id"])])
        logger.info(f"process {rank + 1} of {world}: generated {own} of {len(requests)} requests")


def load_generator(backend: str, model: str, **options) -> Generator:
    """A Generator for `model` on `backend` ("hf", "vllm" or "openai"); options go to its constructor."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    try:
        generator = BACKENDS[backend](model, **options)
    except OSError as err:  # transformers' word for a model that is not there (no such folder, not on the Hub)
        if backend == "openai":
            raise
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise InputError("--model", None, None, f"cannot load {model!r}: {first}") from None
    if process_group()[1] > 1:
        return DataParallel(generator, round_size=4 * options.get("batch_size", 8))
    return generator


def generate_run(generator: Generator, requests: list[dict], out_path, meta: dict | None = None,
                 progress: bool = True, header: dict | None = None, new_run: bool = False) -> list[dict]:
    """Generate every request not yet done in the run file at `out_path`, appending one line per finished
    request (`{**meta[id], "id": id, "response": text}`, plus `"error"` if it failed for good), then
    rewrite the file in request order. Killing it and running it again loses and duplicates nothing.
    `header` / `new_run`: what makes the answers, checked against an existing file (see RunFile)."""
    from tqdm.auto import tqdm

    meta = meta or {}
    run = RunFile(out_path, header=header, new_run=new_run)
    pending = run.pending(requests)
    wanted = {str(r["id"]): r["id"] for r in pending}
    done = set()
    with tqdm(total=len(pending), desc=f"generate {Path(out_path).name}", disable=not progress or not pending) as bar:
        for result in generator.generate(pending) if pending else ():
            key = str(result["id"])
            if key not in wanted or key in done:
                raise RuntimeError(f"backend returned an unexpected or repeated id {result['id']!r}")
            done.add(key)
            run.append(_run_record(meta, wanted[key], result.get("text"), result.get("error")))
            bar.update()
    for key in wanted.keys() - done:  # a backend that stopped early must not make samples vanish
        run.append(_run_record(meta, wanted[key], None, "no result from the backend"))
    return run.finalize([r["id"] for r in requests])


def _run_record(meta: dict, request_id, text, error) -> dict:
    record = {**meta.get(request_id, {}), "id": request_id, "response": text}
    record.pop("error", None)
    if error:
        record["error"] = error
    return record
