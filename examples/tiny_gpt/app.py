"""A tiny GPT decoder under continuous batching, served as an OpenAI model: built from its config, nothing downloaded.

    ember dev examples/tiny_gpt/app.py
    python -c 'import openai; c = openai.OpenAI(base_url="http://127.0.0.1:8700/openai/v1", api_key="dev");
               print(c.completions.create(model="tiny-gpt", prompt="Hello", max_tokens=16).choices[0].text)'

``setup`` builds a 2-layer GPT with random weights (seeded: every replica holds the same model) over a byte-level
vocabulary (a text's UTF-8 bytes), and one KV cache for all sequences, allocated once: a slot of ``CONTEXT``
positions per sequence that may run (``MAX_SEQS``). A new sequence takes a free slot and reads its prompt (its
prefill: the new ones of a step together, in one pass) straight into it; one ``step`` then decodes the next byte of
every running sequence in one batched forward pass that writes each one's new keys and values in place and attends
over its own slot, masked to its length. Nothing is copied, padded or stacked per sequence, so sequences join and
leave at every step for free; a sequence that left (``Sequence.done``) gives its slot back. Decoding is greedy: the
same prompt gives the same text.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

import ember

app = ember.App("tiny-gpt")
WIDTH, HEADS, LAYERS, CONTEXT, MAX_SEQS = 64, 2, 2, 512, 32
Attend = Callable[[int, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


class Block(nn.Module):
    def __init__(self, index: int) -> None:
        super().__init__()
        self.index = index
        self.ln1, self.ln2 = nn.LayerNorm(WIDTH), nn.LayerNorm(WIDTH)
        self.qkv, self.proj = nn.Linear(WIDTH, 3 * WIDTH), nn.Linear(WIDTH, WIDTH)
        self.mlp = nn.Sequential(nn.Linear(WIDTH, 4 * WIDTH), nn.GELU(), nn.Linear(4 * WIDTH, WIDTH))

    def forward(self, x: torch.Tensor, attend: Attend, mask: torch.Tensor) -> torch.Tensor:
        """``x``: (B, T, W); ``attend(layer, k, v)``: the keys and values to attend over, given the new ones (it
        caches them); ``mask``: (B, 1, T, S), True where seen."""
        b, t, _ = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, HEADS, WIDTH // HEADS).permute(2, 0, 3, 1, 4)
        k, v = attend(self.index, k, v)
        att = nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        x = x + self.proj(att.transpose(1, 2).reshape(b, t, WIDTH))
        return x + self.mlp(self.ln2(x))


class Gpt(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.tokens, self.positions = nn.Embedding(256, WIDTH), nn.Embedding(CONTEXT, WIDTH)
        self.blocks = nn.ModuleList(Block(i) for i in range(LAYERS))
        self.head = nn.Linear(WIDTH, 256)

    def forward(self, ids: torch.Tensor, positions: torch.Tensor, attend: Attend, mask: torch.Tensor) -> torch.Tensor:
        """The hidden states (B, T, W) of ``ids`` (B, T) at ``positions`` (B, T)."""
        x = self.tokens(ids) + self.positions(positions)
        for block in self.blocks:
            x = block(x, attend, mask)
        return x


class KVCache:
    """Keys and values of every layer for ``MAX_SEQS`` slots of ``CONTEXT`` positions, allocated once."""

    def __init__(self) -> None:
        self.kv = torch.zeros(LAYERS, 2, MAX_SEQS, HEADS, CONTEXT, WIDTH // HEADS)
        self.free = list(range(MAX_SEQS - 1, -1, -1))
        self.holders: dict[int, ember.Sequence] = {}

    def take(self, seq: ember.Sequence) -> int | None:
        """A free slot for ``seq`` (the slots of the sequences that left are free again); None when all are held."""
        for slot, holder in list(self.holders.items()):
            if holder.done:
                del self.holders[slot]
                self.free.append(slot)
        if not self.free:
            return None
        slot = self.free.pop()
        self.holders[slot] = seq
        return slot


@app.model(timeout_s=300)
class TinyGPT:
    @ember.setup
    def load(self) -> None:
        torch.manual_seed(0)
        torch.set_num_threads(1)
        self.model = Gpt().eval()
        self.cache = KVCache()

    @ember.method(openai="tiny-gpt", batch=ember.Continuous(max_seqs=MAX_SEQS))
    def step(self, seqs: list[ember.Sequence]) -> list[str | None]:
        """One step for every running sequence: a new one reads its prompt (its prefill), whose last position gives
        its first piece at once; the others decode their next piece together, in one batched forward pass."""
        out: list[str | None] = [None] * len(seqs)
        new = [i for i, seq in enumerate(seqs) if seq.state is None]
        running = [i for i, seq in enumerate(seqs) if seq.state is not None]
        with torch.inference_mode():
            if running:
                for i, piece in zip(running, self._decode([seqs[i] for i in running]), strict=True):
                    out[i] = piece
            admitted = [i for i in new if self._admit(seqs[i])]
            if admitted:
                self._prefill([seqs[i] for i in admitted])
                for i in admitted:
                    out[i] = bytes([seqs[i].state["next"]]).decode("latin-1")
        return out  # a sequence given no slot (never: the replica runs MAX_SEQS at most) ends at once

    def _admit(self, seq: ember.Sequence) -> bool:
        slot = self.cache.take(seq)
        if slot is not None:
            seq.state = {"slot": slot, "length": 0, "next": 0}
        return slot is not None

    def _prefill(self, seqs: list[ember.Sequence]) -> None:
        """The new sequences' prompts in one forward pass (padded on the right: causal attention never sees a pad),
        each one's keys and values written into its slot; its last position predicts its first piece."""
        prompts = [list(seq.request.text().encode()[-(CONTEXT // 2):]) or [0] for seq in seqs]
        lengths = torch.tensor([len(p) for p in prompts])
        longest = int(lengths.max())
        ids = torch.tensor([p + [0] * (longest - len(p)) for p in prompts])
        slots = torch.tensor([seq.state["slot"] for seq in seqs])
        kv = self.cache.kv

        def attend(layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            kv[layer, 0, slots, :, :longest] = k  # a pad's keys land past the prompt: overwritten as it decodes
            kv[layer, 1, slots, :, :longest] = v
            return k, v

        positions = torch.arange(longest).expand(len(seqs), longest)
        seen = torch.ones(longest, longest, dtype=torch.bool).tril()
        hidden = self.model(ids, positions, attend, seen)
        logits = self.model.head(hidden[torch.arange(len(seqs)), lengths - 1])
        for row, seq in enumerate(seqs):
            seq.state.update(length=int(lengths[row]), next=int(logits[row].argmax()))

    def _decode(self, seqs: list[ember.Sequence]) -> list[str | None]:
        """Feed each sequence's last piece (``next``) at its length; the piece it predicts is the step's."""
        states = [seq.state for seq in seqs]
        slots = torch.tensor([s["slot"] for s in states])
        at = torch.tensor([s["length"] for s in states])
        span = int(at.max()) + 1
        kv = self.cache.kv
        first = int(slots[0])  # slots in a row (sequences that came together): read as a view, not gathered
        rows = slice(first, first + len(seqs)) if torch.equal(slots, torch.arange(first, first + len(seqs))) \
            else slots

        def attend(layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            kv[layer, 0, slots, :, at] = k[:, :, 0]
            kv[layer, 1, slots, :, at] = v[:, :, 0]
            return kv[layer, 0, rows, :, :span], kv[layer, 1, rows, :, :span]

        seen = (torch.arange(span) <= at[:, None])[:, None, None, :]
        hidden = self.model(torch.tensor([[s["next"]] for s in states]), at[:, None], attend, seen)
        predicted = self.model.head(hidden[:, -1]).argmax(-1).tolist()
        out: list[str | None] = []
        for state, token in zip(states, predicted, strict=True):
            state["length"] += 1
            state["next"] = token
            out.append(bytes([token]).decode("latin-1") if state["length"] < CONTEXT else None)
        return out  # a sequence whose context is full ends
