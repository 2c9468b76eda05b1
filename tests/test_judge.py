"""JudgeClient against a real local chat-completions server: faults, caching, deduplication."""

import json

from chat_server import ChatServer, Flaky, Reply, last_user_text

from eval.judge import JudgeClient

FAST = {"backoff": 0.01, "max_backoff": 0.05}


def test_judge_retries_caches_and_costs_nothing_on_a_rerun(tmp_path, monkeypatch):
    monkeypatch.delenv("JUDGE_KEY", raising=False)
    cache = tmp_path / "judge_cache.jsonl"
    faults = [Reply.error(429, retry_after=0), Reply.error(502), Reply.slow(1.0), Reply.garbage(b"{not json")]
    flaky = Flaky(lambda req: "verdict: " + last_user_text(req), faults)

    def reply(req):
        return Reply.error(500) if last_user_text(req) == "doomed" else flaky(req)

    prompts = ["p1", "p2", "p1", "doomed", [{"role": "system", "content": "be brief"}, {"role": "user", "content": "p3"}]]
    with ChatServer(reply) as server:
        judge = JudgeClient("judge-model", base_url=server.base_url, api_key_env="JUDGE_KEY", concurrency=2,
                            max_retries=len(faults), timeout=0.4, max_tokens=9, cache_path=cache, **FAST)
        results = judge.complete(prompts)
        first_round = len(server.requests)
        sent = list(server.requests)
    assert results[:3] == [{"text": "verdict: p1"}, {"text": "verdict: p2"}, {"text": "verdict: p1"}]
    assert results[3]["text"] is None and "InternalServerError" in results[3]["error"]
    assert results[4] == {"text": "verdict: p3"}
    assert flaky.calls == {"p1": len(faults) + 1, "p2": len(faults) + 1, "p3": len(faults) + 1}  # p1 sent once
    assert all(r["temperature"] == 0 and r["max_tokens"] == 9 and r["model"] == "judge-model" for r in sent)
    assert any(r["messages"] == prompts[4] for r in sent)  # message lists are sent as they are
    assert any(r["messages"] == [{"role": "user", "content": "p2"}] for r in sent)
    lines = [json.loads(line) for line in cache.read_text().splitlines()]
    assert sorted(line["text"] for line in lines) == ["verdict: p1", "verdict: p2", "verdict: p3"]  # no failures
    assert first_round == 3 * (len(faults) + 1) + len(faults) + 1

    # A new client on the same cache answers everything it knows without a server or a key.
    rerun = JudgeClient("judge-model", api_key_env="JUDGE_KEY", cache_path=cache)
    assert rerun.complete(["p2", "p1"]) == [{"text": "verdict: p2"}, {"text": "verdict: p1"}]
    # The cache is keyed by the judge model too.
    with ChatServer(lambda req: "other") as server:
        other = JudgeClient("other-judge", base_url=server.base_url, cache_path=cache, **FAST)
        assert other.complete(["p1"]) == [{"text": "other"}]
        assert len(server.requests) == 1


def test_judge_without_cache_sends_every_distinct_prompt_once():
    with ChatServer(lambda req: last_user_text(req)[::-1]) as server:
        judge = JudgeClient("m", base_url=server.base_url, **FAST)
        assert judge.complete(["abc", "abc", "xy"]) == [{"text": "cba"}, {"text": "cba"}, {"text": "yx"}]
        assert sorted(last_user_text(r) for r in server.requests) == ["abc", "xy"]
        assert judge.complete([]) == []
