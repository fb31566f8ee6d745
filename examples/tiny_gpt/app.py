"""A tiny GPT decoder under continuous batching, served as an OpenAI model: built from its config, nothing downloaded.

    ember dev examples/tiny_gpt/app.py
    python -c 'import openai; c = openai.OpenAI(base_url="http://127.0.0.1:8700/openai/v1", api_key="dev");
               print(c.completions.create(model="tiny-gpt", prompt="Hello", max_tokens=16).choices[0].text)'

``setup`` builds a 2-layer GPT with random weights (seeded: every replica holds the same model) over a byte-level
vocabulary (a text's UTF-8 bytes). Each request is an ``ember.Sequence`` whose ``state`` is its own KV cache; one
``step`` decodes the next byte of every running sequence in one batched forward pass (the caches padded to the
longest, masked), so sequences join and leave at every step. Decoding is greedy: the same prompt gives the same text.
"""

from __future__ import annotations

import torch
from torch import nn

import ember

app = ember.App("tiny-gpt")
WIDTH, HEADS, LAYERS, CONTEXT = 64, 2, 2, 512


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(WIDTH), nn.LayerNorm(WIDTH)
        self.qkv, self.proj = nn.Linear(WIDTH, 3 * WIDTH), nn.Linear(WIDTH, WIDTH)
        self.mlp = nn.Sequential(nn.Linear(WIDTH, 4 * WIDTH), nn.GELU(), nn.Linear(4 * WIDTH, WIDTH))

    def forward(self, x: torch.Tensor, past: torch.Tensor | None, mask: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """``x``: (B, T, W); ``past``: (2, B, H, P, W/H) or None; ``mask``: (B, 1, T, P+T), True where seen."""
        b, t, _ = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, HEADS, WIDTH // HEADS).permute(2, 0, 3, 1, 4)
        if past is not None:
            k, v = torch.cat([past[0], k], dim=2), torch.cat([past[1], v], dim=2)
        att = nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        x = x + self.proj(att.transpose(1, 2).reshape(b, t, WIDTH))
        return x + self.mlp(self.ln2(x)), torch.stack([k, v])


class Gpt(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.tokens, self.positions = nn.Embedding(256, WIDTH), nn.Embedding(CONTEXT, WIDTH)
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.head = nn.Linear(WIDTH, 256)

    def forward(self, ids: torch.Tensor, start: torch.Tensor, past: list[torch.Tensor] | None,
                mask: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        positions = (start[:, None] + torch.arange(ids.shape[1])).clamp(0, CONTEXT - 1)
        x = self.tokens(ids) + self.positions(positions)
        caches = []
        for i, block in enumerate(self.blocks):
            x, cache = block(x, past[i] if past is not None else None, mask)
            caches.append(cache)
        return self.head(x[:, -1]), caches


@app.model(timeout_s=300)
class TinyGPT:
    @ember.setup
    def load(self) -> None:
        torch.manual_seed(0)
        torch.set_num_threads(1)
        self.model = Gpt().eval()

    @ember.method(openai="tiny-gpt", batch=ember.Continuous(max_seqs=32))
    def step(self, seqs: list[ember.Sequence]) -> list[str | None]:
        """One step for every running sequence: a new one reads its prompt (its prefill), whose last position gives
        its first piece at once; the others decode their next piece together, in one batched forward pass."""
        out: list[str | None] = [None] * len(seqs)
        new = [i for i, seq in enumerate(seqs) if seq.state is None]
        running = [i for i, seq in enumerate(seqs) if seq.state is not None]
        with torch.inference_mode():
            if new:
                self._prefill([seqs[i] for i in new])
                for i in new:
                    out[i] = bytes([seqs[i].state["next"]]).decode("latin-1")
            if running:
                for i, piece in zip(running, self._decode([seqs[i] for i in running]), strict=True):
                    out[i] = piece
        return out

    def _prefill(self, seqs: list[ember.Sequence]) -> None:
        """The new sequences' prompts in one forward pass (padded on the left, masked): each one's cache, and the
        piece its last position predicts."""
        prompts = [list(seq.request.text().encode()[-(CONTEXT // 2):]) or [0] for seq in seqs]
        longest = max(len(p) for p in prompts)
        pad = [longest - len(p) for p in prompts]
        ids = torch.tensor([[0] * p + prompt for p, prompt in zip(pad, prompts, strict=True)])
        seen = torch.ones(len(seqs), longest, longest, dtype=torch.bool).tril()
        for row, p in enumerate(pad):
            seen[row, :, :p] = False
            seen[row, :p, :p] = torch.eye(p, dtype=torch.bool)  # a pad sees itself only: no empty row
        logits, caches = self.model(ids, -torch.tensor(pad), None, seen[:, None])
        for row, (seq, p) in enumerate(zip(seqs, pad, strict=True)):
            seq.state = {"next": int(logits[row].argmax()), "length": longest - p,
                         "caches": [c[:, row, :, p:] for c in caches]}

    def _decode(self, seqs: list[ember.Sequence]) -> list[str | None]:
        """Feed each sequence's last piece (``next``); the piece it predicts is the step's."""
        states = [seq.state for seq in seqs]
        longest = max(s["length"] for s in states)
        pad = [longest - s["length"] for s in states]
        pairs = list(zip(states, pad, strict=True))
        past = [torch.stack([nn.functional.pad(s["caches"][i], (0, 0, p, 0)) for s, p in pairs], dim=1)
                for i in range(LAYERS)]  # (2, B, H, longest, W/H), each padded on the left
        seen = torch.ones(len(seqs), longest + 1, dtype=torch.bool)
        for row, p in enumerate(pad):
            seen[row, :p] = False
        ids = torch.tensor([[s["next"]] for s in states])
        start = torch.tensor([s["length"] for s in states])
        logits, caches = self.model(ids, start, past, seen[:, None, None, :])
        out: list[str | None] = []
        for row, (state, p) in enumerate(zip(states, pad, strict=True)):
            state["caches"] = [c[:, row, :, p:] for c in caches]
            state["length"] += 1
            state["next"] = int(logits[row].argmax())
            out.append(bytes([state["next"]]).decode("latin-1") if state["length"] < CONTEXT else None)
        return out  # a sequence whose context is full ends
