"""The general benchmarks through the OpenAI-compatible backend, against a real local HTTP server: images arrive in
order, and a server that answers right gets full marks."""

import base64
import io
import json

from chat_server import ChatServer, image_urls, last_user_text
from general_fixtures import COLORS, save
from PIL import Image

from eval.__main__ import main
from store.runs import read_jsonl

COLOR_NAMES = {rgb: name for name, rgb in COLORS.items()}


def colors(request) -> str:
    names = []
    for url in image_urls(request):
        with Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1]))) as image:
            names.append(COLOR_NAMES[image.convert("RGB").getpixel((0, 0))])
    return " ".join(names)


def test_mmmu_images_in_order_and_mme_full_marks(tmp_path, monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)  # a local server at --base-url needs no key
    data = save("mmmu", tmp_path / "mmmu-data")
    run = tmp_path / "mmmu.jsonl"
    with ChatServer(colors) as server:
        assert main(["general", "mmmu", "--model", "served", "--backend", "openai", "--base-url", server.base_url,
                     "--dataset", str(data), "--out", str(run)]) == 0
    assert [r["response"] for r in read_jsonl(run)] == ["red", "green", "red green blue", "white"]

    def oracle(request):
        text = last_user_text(request)
        return "Yes" if "train" in text or "python" in text else "No, it is not."

    data = save("mme", tmp_path / "mme-data")
    run = tmp_path / "mme.jsonl"
    with ChatServer(oracle) as server:
        assert main(["general", "mme", "--model", "served", "--backend", "openai", "--base-url", server.base_url,
                     "--dataset", str(data), "--out", str(run)]) == 0
        assert all(r["max_tokens"] == 2048 and r["temperature"] == 0 for r in server.requests)
    assert main(["general", "score", "mme", str(run), "--out", str(tmp_path / "g" / "mme.json")]) == 0
    score = json.loads((tmp_path / "g" / "mme.json").read_text())
    assert (score["perception"], score["cognition"]) == (200.0, 200.0)
