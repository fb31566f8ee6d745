"""A chat model served by vLLM on two GPUs of one node (tensor parallelism), as an OpenAI model.

    ember volume put llama-weights /path/to/Llama-3.1-8B-Instruct/*
    ember push examples/vllm_chat/app.py
    python -c 'import openai; c = openai.OpenAI(base_url=f"{EMBER_URL}/openai/v1", api_key=EMBER_TOKEN);
               print(c.chat.completions.create(model="llama-3.1-8b",
                                               messages=[{"role": "user", "content": "Hi"}]).choices[0].message)'

``gpu=2`` gives each replica two GPUs of one node; ``ember.backends.vllm.Engine`` spreads the model over them. vLLM
batches the requests itself (continuous batching, paged KV cache), so one replica takes many at once
(``max_concurrency``). The platform streams the pieces, enforces ``max_tokens`` and ``stop``, and a client that
leaves aborts its request in the engine. vLLM is imported in ``load``, on the GPU node, never where the app is pushed.
A replica whose engine died (``engine_alive``) is replaced, and a replica that stops shuts its engine down (``stop``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import ember
from ember.backends import vllm as evllm

app = ember.App("vllm-chat")
WEIGHTS = ember.Volume("llama-weights")


@app.model(gpu=2, min_replicas=1, max_concurrency=256, timeout_s=600, volumes={"/weights": WEIGHTS},
           startup_timeout_s=1200)
class Llama:
    @ember.setup
    def load(self) -> None:
        self.engine = evllm.Engine("/weights", max_model_len=8192, gpu_memory_utilization=0.9)

    @ember.method(openai="llama-3.1-8b")
    async def chat(self, req: ember.openai.ChatRequest) -> AsyncIterator[str]:
        async for piece in self.engine.generate(req):
            yield piece

    @ember.health(every_s=10)
    def engine_alive(self) -> None:
        self.engine.check_health()  # its core process died: this replica is replaced

    @ember.teardown
    def stop(self) -> None:
        self.engine.shutdown()
