"""Ray Serve scale-out (onnx_light_kv.serve.ray): a local Ray instance on the loopback address
with 2 engine replicas behind the OpenAI-compatible ingress. Session affinity keeps a
conversation on one replica; results equal the single-process server's (generate() alone).

Ray is not installed by ``scripts/run.sh`` (its install takes about 2 minutes); with
``pip install 'onnx-light-kv[ray]'`` these tests run, otherwise they are skipped."""

from __future__ import annotations

import socket
import time
from typing import Any, Iterator

import pytest

ray = pytest.importorskip("ray", reason="ray (optional extra 'ray') is not installed; pip install 'onnx-light-kv[ray]'")
serve = pytest.importorskip("ray.serve", reason="ray[serve] (optional extra 'ray') is not installed")
httpx = pytest.importorskip("httpx", reason="httpx (the tests' HTTP client) is not installed")

from _gen_common import model  # noqa: E402
from test_serve_http import MODEL, P1, P2, TOK, expected_text, words  # noqa: E402

from onnx_light_kv.serve.ray import build_app  # noqa: E402

NAME = "tiny-llama"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: Any) -> Iterator[str]:
    d = tmp_path_factory.mktemp("ray")
    path = d / "m.onnx"
    path.write_bytes(model(MODEL).SerializeToString())
    TOK.save(str(d / "tokenizer.json"))
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    ray.init(num_cpus=3, include_dashboard=False, _node_ip_address="127.0.0.1", log_to_driver=False)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        serve.run(build_app(str(path), str(d / "tokenizer.json"), replicas=2, threads=1, model_name=NAME,
                            engine_options={"max_batch": 8, "max_length": 96}), route_prefix="/", name="olkv")
        url = f"http://127.0.0.1:{port}"
        deadline = time.time() + 120
        while True:
            try:
                if httpx.get(url + "/health", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.time() < deadline, "the Ray Serve app did not come up"
            time.sleep(0.5)
        yield url
    finally:
        serve.shutdown()
        ray.shutdown()


def _replica_requests() -> list:
    return [serve.get_deployment_handle(f"olkv-engine-{i}", app_name="olkv").stats.remote().result()["requests"]
            for i in range(2)]


def test_results_equal_single_process(cluster: str) -> None:
    with httpx.Client(base_url=cluster, timeout=120) as h:
        r = h.post("/v1/completions", json={"model": NAME, "prompt": P1, "max_tokens": 8, "temperature": 0})
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["text"] == expected_text(P1, 8)
        r = h.post("/v1/completions", json={"prompt": P2, "max_tokens": 6, "temperature": 0.8, "seed": 3})
        assert r.json()["choices"][0]["text"] == expected_text(P2, 6, do_sample=True, temperature=0.8, seed=3)
        text = []
        with h.stream("POST", "/v1/completions", json={"prompt": P2, "max_tokens": 7, "temperature": 0,
                                                        "stream": True}) as s:
            for line in s.iter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    import json

                    text.append(json.loads(line[6:])["choices"][0]["text"])
        assert "".join(text) == expected_text(P2, 7)
        assert h.post("/v1/completions", content=b"{bad").status_code == 400
        assert "olkv_requests_total" in h.get("/metrics").text


def test_session_affinity_keeps_a_conversation_on_one_replica(cluster: str) -> None:
    with httpx.Client(base_url=cluster, timeout=120) as h:
        for conv in ("conv-a", "conv-b"):
            before = _replica_requests()
            for turn in range(3):
                r = h.post("/v1/completions", json={"prompt": words([3 + turn, 9]), "max_tokens": 3, "temperature": 0},
                           headers={"x-session-id": conv})
                assert r.status_code == 200
            delta = [a - b for a, b in zip(_replica_requests(), before)]
            assert sorted(delta) == [0, 3], delta
        # without a session key, concurrent requests spread over both replicas
        before = _replica_requests()
        import concurrent.futures as cf

        with cf.ThreadPoolExecutor(4) as ex:
            list(ex.map(lambda i: h.post("/v1/completions", json={"prompt": words([i, 5]), "max_tokens": 12,
                                                                  "temperature": 0}), range(4)))
        delta = [a - b for a, b in zip(_replica_requests(), before)]
        assert sum(delta) == 4 and min(delta) >= 1, delta
