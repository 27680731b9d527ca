"""Scale-out on Ray Serve (extra ``ray``): several engines behind one OpenAI-compatible API.

:func:`build_app` returns a Ray Serve application of ``replicas`` engine deployments
(``olkv-engine-0`` ..; each a :class:`EngineReplica` holding an
:class:`~onnx_light_kv.InferenceSession` and an :class:`~onnx_light_kv.serve.Engine`) and one
ingress deployment (``olkv-ingress``) that serves the same HTTP API as
``python -m onnx_light_kv serve`` (:mod:`onnx_light_kv.serve.http`) and routes each request to
an engine:

* session affinity: requests carrying a conversation key (the ``x-session-id`` header, else the
  OpenAI ``user`` field) go to the engine that served that key first (kept for the most recent
  ``affinity_size`` keys);
* other requests go to the engine with the fewest requests in flight from this ingress (Ray
  Serve's own router cannot be told to prefer a replica by prompt prefix here; an engine made
  with ``prefix_cache=True`` shares prefixes among its own requests only, so there is no
  prefix affinity across replicas).

Each engine is its own deployment with one replica, so that the ingress can address it; tokens
stream from the engine to the ingress through a streaming ``DeploymentHandle`` call, and a client
that disconnects cancels that call, which aborts the engine's request.

Run it (one host): ``python -m onnx_light_kv.serve.ray MODEL.onnx --tokenizer tokenizer.json
--replicas 2 --port 8000``. On a multi-host cluster: start Ray on each host (``ray start --head``
on one, ``ray start --address HEAD:6379`` on the others), make the model and tokenizer files
readable at the same path on every host, then run the same command on the head with
``--address auto --host 0.0.0.0``; set ``--num-cpus`` to the cores one engine should have, and
Ray places the engine deployments on hosts with free CPUs.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import sys
from typing import Any, AsyncIterator, Callable, Dict, List, Optional

from .._optional import require
from .engine import StepOutput

__all__ = ["EngineReplica", "RayBackend", "Ingress", "build_app", "main"]


class EngineReplica:
    """One engine (the body of an ``olkv-engine-i`` deployment): loads ``model`` with
    ``threads`` and runs an :class:`~onnx_light_kv.serve.Engine` with ``engine_options``."""

    def __init__(self, model: str, engine_options: Optional[Dict[str, Any]] = None,
                 threads: Optional[int] = None, index: int = 0) -> None:
        from .. import InferenceSession
        from .engine import Engine
        from .http import EngineLoop

        sess = InferenceSession(model, threads=threads)
        opts = dict(engine_options or {})

        def factory() -> Engine:
            return Engine(sess, **opts)

        self.index = index
        self.loop = EngineLoop(factory(), factory)

    async def generate(self, prompt: List[int], options: Dict[str, Any]) -> AsyncIterator[Any]:
        """Stream one request: ``(tokens, logprobs, top_logprobs, finish_reason, finished)``
        tuples; cancelling the call aborts the request."""
        loop = asyncio.get_running_loop()
        q: "asyncio.Queue[Any]" = asyncio.Queue()
        rid = self.loop.submit(prompt, lambda item: loop.call_soon_threadsafe(q.put_nowait, item), **options)
        try:
            while True:
                item = await q.get()
                if isinstance(item, Exception):
                    raise RuntimeError(f"engine {self.index}: {item}")
                out, lps, tops, reason = item
                yield (list(out.tokens), lps, tops, reason, out.finished)
                if out.finished:
                    return
        finally:
            self.loop.abort(rid)

    def stats(self) -> Dict[str, Any]:
        """The engine's stats, with ``replica`` (its index)."""
        return dict(self.loop.stats(), replica=self.index)

    def max_length(self) -> int:
        """The engine's positions per sequence."""
        return self.loop.max_length

    def __del__(self) -> None:
        loop = getattr(self, "loop", None)
        if loop is not None:
            loop.close()


class RayBackend:
    """The ingress's view of the engines: :class:`~onnx_light_kv.serve.http.EngineLoop`'s
    interface over ``DeploymentHandle``\\ s, with session-affinity and least-in-flight routing."""

    def __init__(self, handles: List[Any], max_length: int, affinity_size: int = 65536) -> None:
        self.handles = handles
        self.max_length = max_length
        self.in_flight = [0] * len(handles)
        self.routed = [0] * len(handles)
        self._affinity: "collections.OrderedDict[str, int]" = collections.OrderedDict()
        self._affinity_size = affinity_size
        self._ids = 0
        self._calls: Dict[int, Any] = {}

    def route(self, session: Optional[str]) -> int:
        """The engine index for a request of conversation ``session`` (None: least in flight)."""
        if session is not None and session in self._affinity:
            self._affinity.move_to_end(session)
            return self._affinity[session]
        i = min(range(len(self.handles)), key=lambda j: (self.in_flight[j], self.routed[j]))
        if session is not None:
            self._affinity[session] = i
            while len(self._affinity) > self._affinity_size:
                self._affinity.popitem(last=False)
        return i

    def submit(self, input_ids: Any, sink: Callable[[Any], None], session: Optional[str] = None,
               **options: Any) -> int:
        """Start a request on the routed engine; ``sink`` gets the same items as from
        :class:`~onnx_light_kv.serve.http.EngineLoop`."""
        i = self.route(session)
        self._ids += 1
        rid = self._ids
        prompt = [int(t) for t in input_ids]
        call = self.handles[i].options(stream=True).generate.remote(prompt, options)
        self.in_flight[i] += 1
        self.routed[i] += 1

        async def pump() -> None:
            try:
                async for tokens, lps, tops, reason, finished in call:
                    sink((StepOutput(rid, tokens, finished), lps, tops, reason))
                    if finished:
                        return
            except asyncio.CancelledError:
                raise
            except Exception as e:  # the engine or the replica failed
                sink(e)
            finally:
                self.in_flight[i] -= 1
                self._calls.pop(rid, None)

        self._calls[rid] = (call, asyncio.ensure_future(pump()))
        return rid

    def abort(self, rid: int) -> None:
        """Cancel a request's streaming call (the engine aborts it)."""
        entry = self._calls.pop(rid, None)
        if entry is not None:
            call, task = entry
            call.cancel()
            task.cancel()

    async def stats(self) -> Dict[str, Any]:
        """Engine stats summed over the engines (``replicas``: each one's, ``routed``: requests
        this ingress sent to each)."""
        per = list(await asyncio.gather(*(h.stats.remote() for h in self.handles)))
        total: Dict[str, Any] = {}
        for st in per:
            for k, v in st.items():
                if isinstance(v, bool) or k in ("replica", "budget", "max_batch", "request_bytes"):
                    continue
                if isinstance(v, (int, float)):
                    total[k] = total.get(k, 0) + v
                elif isinstance(v, dict):
                    d = total.setdefault(k, {})
                    for a, b in v.items():
                        d[a] = d.get(a, 0) + b
                elif k not in total:
                    total[k] = v
        total["replicas"] = per
        total["routed"] = list(self.routed)
        return total

    def close(self) -> None:
        """Cancel every call in flight."""
        for rid in list(self._calls):
            self.abort(rid)


class Ingress:
    """The HTTP ingress deployment's body: the app of :mod:`onnx_light_kv.serve.http` over a
    :class:`RayBackend` of the engine deployments ``handles``."""

    def __init__(self, *handles: Any, tokenizer: str, model_name: str, max_length: int,
                 chat_template: Optional[str] = None) -> None:
        self.backend = RayBackend(list(handles), max_length)
        self.tokenizer, self.model_name, self.chat_template = tokenizer, model_name, chat_template

    def __serve_build_asgi_app__(self) -> Any:
        from .http import create_app

        return create_app(self.backend, self.tokenizer, model_name=self.model_name, chat_template=self.chat_template)


def build_app(model: str, tokenizer: str, *, replicas: int = 2, engine_options: Optional[Dict[str, Any]] = None,
              threads: Optional[int] = None, model_name: Optional[str] = None, num_cpus: float = 1.0,
              chat_template: Optional[str] = None) -> Any:
    """A Ray Serve application: ``replicas`` engine deployments and the HTTP ingress (see the
    module docstring). ``model`` and ``tokenizer`` are paths every Ray node can read;
    ``engine_options`` are :class:`~onnx_light_kv.serve.Engine` keyword arguments (``max_batch``,
    ``max_length``, ``budget``, ...); ``num_cpus`` is what Ray reserves per engine. Run it with
    ``ray.serve.run(app, route_prefix="/")``."""
    serve = require("ray.serve")
    if replicas < 1:
        raise ValueError(f"replicas must be >= 1, got {replicas}")
    opts = dict(engine_options or {})
    max_length = int(opts.get("max_length", 2048))
    engines = [serve.deployment(EngineReplica, name=f"olkv-engine-{i}", num_replicas=1,
                                ray_actor_options={"num_cpus": num_cpus}).bind(
        os.path.abspath(model), opts, threads, i) for i in range(replicas)]
    ingress = serve.deployment(serve.ingress()(Ingress), name="olkv-ingress", num_replicas=1,
                               ray_actor_options={"num_cpus": 0})
    name = model_name or os.path.splitext(os.path.basename(model))[0]
    return ingress.bind(*engines, tokenizer=os.path.abspath(tokenizer) if isinstance(tokenizer, str) else tokenizer,
                        model_name=name, max_length=max_length, chat_template=chat_template)


def main(argv: Optional[List[str]] = None) -> int:
    """``python -m onnx_light_kv.serve.ray MODEL.onnx --tokenizer tokenizer.json ...``."""
    p = argparse.ArgumentParser(prog="python -m onnx_light_kv.serve.ray", description=__doc__.split("\n\n")[0])
    p.add_argument("model")
    p.add_argument("--tokenizer", required=True)
    p.add_argument("--replicas", type=int, default=2, help="engines (each its own deployment)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--address", default=None, help="Ray cluster address ('auto': the running cluster; "
                                                   "default: a local instance)")
    p.add_argument("--num-cpus", type=float, default=1.0, help="CPUs Ray reserves per engine")
    p.add_argument("--threads", type=int, default=None, help="threads of each engine's session")
    p.add_argument("--max-batch", type=int, default=16)
    p.add_argument("--max-length", type=int, default=2048)
    p.add_argument("--model-name", default=None)
    args = p.parse_args(argv)
    for name in ("replicas", "max_batch", "max_length"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    if not 0 <= args.port <= 65535:
        p.error(f"--port must be in [0, 65535], got {args.port}")
    for path in (args.model, args.tokenizer):
        if not os.path.isfile(path):
            p.error(f"no such file: {path}")
    try:
        ray = require("ray")
        serve = require("ray.serve")
    except ImportError as e:
        print(f"{p.prog}: error: {e}", file=sys.stderr)
        return 2
    ray.init(address=args.address)
    serve.start(http_options={"host": args.host, "port": args.port})
    serve.run(build_app(args.model, args.tokenizer, replicas=args.replicas, threads=args.threads,
                        model_name=args.model_name, num_cpus=args.num_cpus,
                        engine_options={"max_batch": args.max_batch, "max_length": args.max_length}),
              route_prefix="/", blocking=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
