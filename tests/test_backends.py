"""The Generator backends and the shared OpenAI-compatible client, against a real local HTTP server."""

import base64
import io
import threading
import time

import pytest
from chat_server import ChatServer, Flaky, Reply, image_urls, last_user_text
from PIL import Image

from cli.errors import InputError
from eval.backends import generate_run, load_generator, vllm_input
from store.runs import read_jsonl
from vlm.chat_client import ChatClient, openai_messages

FAST = {"backoff": 0.01, "max_backoff": 0.05}  # retries without real waiting


def picture(colour=(200, 40, 40), size=(40, 30)):
    image = Image.new("RGB", size, colour)
    image.putpixel((3, 4), (1, 2, 3))  # one odd pixel a lossy codec would smear
    return image


def request(i, image=None):
    return {"id": f"r{i}", "images": [image or picture()],
            "messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": f"question {i}"}]}]}


def test_openai_messages_put_the_image_first_as_a_lossless_png():
    image = picture()
    messages = openai_messages(request(0, image))
    parts = messages[0]["content"]
    assert [p["type"] for p in parts] == ["image_url", "text"]
    url = parts[0]["image_url"]["url"]
    assert url.startswith("data:image/png;base64,")
    decoded = Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1])))
    assert decoded.format == "PNG" and decoded.convert("RGB").tobytes() == image.tobytes()


def test_image_paths_are_read_and_counted(tmp_path):
    path = tmp_path / "a.png"
    picture().save(path)
    assert openai_messages(request(0, str(path)))[0]["content"][0]["image_url"]["url"] == \
        openai_messages(request(0, picture()))[0]["content"][0]["image_url"]["url"]
    bad = request(1)
    bad["images"] = []
    with pytest.raises(ValueError, match="image parts"):
        list(load_generator("openai", "m", base_url="http://127.0.0.1:9/v1").generate([bad]))


def test_unknown_backend():
    with pytest.raises(ValueError, match="unknown backend"):
        load_generator("tgi", "m")


def test_api_key_only_from_the_environment(monkeypatch):
    monkeypatch.delenv("MY_KEY", raising=False)
    with pytest.raises(InputError, match="MY_KEY: not set"):
        ChatClient("gpt-4o", api_key_env="MY_KEY")
    ChatClient("local", base_url="http://127.0.0.1:9/v1", api_key_env="MY_KEY")  # a local server needs none


def test_openai_backend_survives_faults_and_records_permanent_failures(tmp_path, monkeypatch):
    secret = "sk-test-secret-value-123"
    monkeypatch.setenv("SPY_TEST_KEY", secret)
    faults = [Reply.error(429, retry_after=0), Reply.error(500), Reply.slow(1.5), Reply.garbage(), Reply.no_choices(),
              Reply(body=b"null"), Reply.error(503)]

    flaky = Flaky(lambda req: f"answer to {last_user_text(req)}", faults)
    calls = {"question 3": 0, "question 4": 0}

    def reply(req):
        text = last_user_text(req)
        if text in calls:
            calls[text] += 1
            return Reply.error(500 if text == "question 3" else 400)  # fails for good / is not retried
        return flaky(req)

    requests = [request(i) for i in range(6)]
    out = tmp_path / "run.jsonl"
    with ChatServer(reply) as server:
        gen = load_generator("openai", "test-model", base_url=server.base_url, api_key_env="SPY_TEST_KEY",
                             concurrency=3, max_retries=len(faults) + 1, timeout=0.4, max_new_tokens=7, **FAST)
        meta = {r["id"]: {"sample": r["id"].upper()} for r in requests}
        records = generate_run(gen, requests, out, meta=meta, progress=False)
        sent = list(server.requests)
    assert [r["id"] for r in records] == [f"r{i}" for i in range(6)]
    assert read_jsonl(out) == records  # finalized: one line per id, request order
    for i, record in enumerate(records):
        assert record["sample"] == f"R{i}"
        if i == 3:
            assert record["response"] is None and "InternalServerError" in record["error"]
            assert f"after {len(faults) + 2} attempt(s)" in record["error"]  # max_retries + 1
        elif i == 4:
            assert record["response"] is None and "BadRequestError" in record["error"]
            assert "after 1 attempt(s)" in record["error"]
        else:
            assert record == {"sample": f"R{i}", "id": f"r{i}", "response": f"answer to question {i}"}
    assert flaky.calls["question 0"] == len(faults) + 1  # every fault met once, then the answer
    assert calls == {"question 3": len(faults) + 2, "question 4": 1}
    first = sent[0]
    assert first["temperature"] == 0 and first["max_tokens"] == 7 and first["model"] == "test-model"
    assert first["messages"][0]["content"][0]["type"] == "image_url"  # image before text
    assert all(url.startswith("data:image/png;base64,") for r in sent for url in image_urls(r))
    assert secret not in out.read_text()

    # Re-running retries only the failed ones; finished lines are neither re-sent nor duplicated.
    with ChatServer(lambda req: "fixed") as server:
        gen = load_generator("openai", "test-model", base_url=server.base_url, api_key_env="SPY_TEST_KEY", **FAST)
        again = generate_run(gen, requests, out, meta=meta, progress=False)
        assert sorted(last_user_text(r) for r in server.requests) == ["question 3", "question 4"]
    assert [r["response"] for r in again] == [f"answer to question {i}" for i in (0, 1, 2)] + ["fixed"] * 2 + \
        ["answer to question 5"]
    assert all("error" not in r for r in again) and len(read_jsonl(out)) == 6


def test_concurrency_is_bounded():
    lock, state = threading.Lock(), {"now": 0, "max": 0}

    def slow_answer(req):
        with lock:
            state["now"] += 1
            state["max"] = max(state["max"], state["now"])
        time.sleep(0.05)
        with lock:
            state["now"] -= 1
        return "ok"

    with ChatServer(slow_answer) as server:
        client = ChatClient("m", base_url=server.base_url, concurrency=3, **FAST)
        results = dict(client.stream((i, [{"role": "user", "content": str(i)}]) for i in range(12)))
    assert results == {i: {"text": "ok"} for i in range(12)}
    assert state["max"] == 3


def test_retry_after_is_respected():
    flaky = Flaky(lambda req: "ok", [Reply.error(429, retry_after=0.3)])
    with ChatServer(flaky) as server:
        # Without the header, the backoff would wait 100 s.
        client = ChatClient("m", base_url=server.base_url, backoff=100, max_backoff=100)
        start = time.monotonic()
        assert list(client.stream([("a", [{"role": "user", "content": "x"}])])) == [("a", {"text": "ok"})]
        assert 0.3 <= time.monotonic() - start < 10


def test_connection_refused_is_an_error_record():
    with ChatServer(lambda req: "ok") as server:
        url = server.base_url
    client = ChatClient("m", base_url=url, max_retries=2, **FAST)  # the server is gone
    [(_key, result)] = list(client.stream([("a", [{"role": "user", "content": "x"}])]))
    assert result["text"] is None and "APIConnectionError" in result["error"] and "3 attempt(s)" in result["error"]


QWEN2_VL_PROMPT = ("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"
                   "<|vision_start|><|image_pad|><|vision_end|>{}<|im_end|>\n<|im_start|>assistant\n")


def test_vllm_prompt_is_the_reference_qwen2_vl_prompt(tiny_model_dir):
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(tiny_model_dir)
    image = picture()
    made = vllm_input(processor, request(7, image))
    assert made["prompt"] == QWEN2_VL_PROMPT.format("question 7")  # spy.md §1.5, verbatim
    assert made["multi_modal_data"]["image"].tobytes() == image.tobytes()


# The prompt each family's own chat template gives vLLM (image part first, then the text, generation prompt).
FAMILY_PROMPTS = {
    "qwen2_vl": QWEN2_VL_PROMPT,
    "qwen2_5_vl": QWEN2_VL_PROMPT,  # Qwen2.5-VL ships Qwen2-VL's template
    "qwen3_vl": "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>{}<|im_end|>\n<|im_start|>assistant\n",
    "qwen3_vl_moe": "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>{}<|im_end|>\n<|im_start|>assistant\n",
    "gemma3": "<bos><start_of_turn>user\n<start_of_image>{}<end_of_turn>\n<start_of_turn>model\n",
}


@pytest.mark.parametrize("family", list(FAMILY_PROMPTS))
def test_vllm_prompt_is_each_familys_own(family, tiny_family_dir):
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(tiny_family_dir(family))
    image = picture()
    made = vllm_input(processor, request(7, image))
    assert made["prompt"] == FAMILY_PROMPTS[family].format("question 7")
    assert made["multi_modal_data"]["image"].tobytes() == image.tobytes()


def test_vllm_backend_says_how_to_get_vllm():
    try:
        import vllm  # noqa: F401

        pytest.skip("vLLM is installed here")
    except ImportError:
        pass
    with pytest.raises(RuntimeError, match="make vllm-env"):
        load_generator("vllm", "some/model")


@pytest.mark.slow
def test_hf_backend_generates_from_image_and_text(tiny_model_dir, tmp_path):
    gen = load_generator("hf", str(tiny_model_dir), batch_size=3, max_new_tokens=6)
    assert gen.processor.tokenizer.padding_side == "left"
    requests = [request(i, picture(size=(40 + 20 * i, 56))) for i in range(4)]
    requests.append({"id": "multi", "images": [], "messages": [
        {"role": "user", "content": "a text-only question"},
        {"role": "assistant", "content": "an answer"},
        {"role": "user", "content": [{"type": "text", "text": "and a follow-up"}]}]})
    results = {r["id"]: r for r in gen.generate(requests)}
    assert set(results) == {"r0", "r1", "r2", "r3", "multi"}
    for result in results.values():
        assert isinstance(result["text"], str) and "error" not in result
        assert result["text"] == result["text"].strip()
        # only the new tokens: the prompt is not echoed back
        assert "helpful assistant" not in result["text"] and "follow-up" not in result["text"]
        assert len(result["text"]) < 120  # 6 tokens of a 1k-token BPE vocabulary
    # batching with left padding does not change greedy outputs
    alone = next(gen.generate([requests[2]]))
    assert alone["text"] == results["r2"]["text"]
    records = generate_run(gen, requests[:2], tmp_path / "hf.jsonl", progress=False)
    assert [r["response"] for r in records] == [results["r0"]["text"], results["r1"]["text"]]
    gen.close()
    assert gen.model is None


@pytest.mark.slow
@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe", "gemma3"])
def test_hf_backend_generates_with_every_family(family, tiny_family_dir):
    gen = load_generator("hf", str(tiny_family_dir(family)), batch_size=3, max_new_tokens=4)
    requests = [request(i, picture(size=(40 + 30 * i, 56))) for i in range(3)]
    results = {r["id"]: r for r in gen.generate(requests)}
    assert set(results) == {"r0", "r1", "r2"}
    assert all(isinstance(r["text"], str) and r["text"] and "error" not in r for r in results.values())
    assert "question" not in "".join(r["text"] for r in results.values())  # only the new tokens
    # left padding in a batch of different image sizes does not change greedy outputs
    assert next(gen.generate([requests[0]]))["text"] == results["r0"]["text"]
    gen.close()


def test_hf_backend_refuses_pixel_bounds_a_family_lacks(tiny_family_dir):
    with pytest.raises(InputError, match="gemma3 resizes every image to one fixed size"):
        load_generator("hf", str(tiny_family_dir("gemma3")), min_pixels=200704)
