"""A text generator that streams its tokens as it makes them: a generator function is all it takes.

    ember dev examples/streamer/app.py
    curl -N -H 'Accept: text/event-stream' -H "Authorization: Bearer $EMBER_TOKEN" \
         -d '{"prompt": "the cat", "max_tokens": 12}' $EMBER_URL/v1/streamer/generate

The "model" is a tiny bigram table built from a few sentences, so that the example needs nothing but Ember; a real
one yields its tokens the same way (see examples/transformers_config for a transformers model in an image).
"""

import itertools
import random
import time
from collections.abc import Iterator

import msgspec

import ember

app = ember.App("streamer")

CORPUS = """the cat sat on the mat . the dog sat on the rug . the cat saw the dog . the dog saw a bird .
a bird sang on the roof . the cat ran to the roof . a dog ran to the mat ."""


def _bigrams(text: str) -> dict[str, list[str]]:
    """Each word and the words that follow it in the corpus: the whole "model"."""
    words = text.split()
    table: dict[str, list[str]] = {}
    for word, after in itertools.pairwise(words):
        table.setdefault(word, []).append(after)
    return table


TABLE = _bigrams(CORPUS)


class Prompt(msgspec.Struct):
    prompt: str
    max_tokens: int = 16
    seed: int = 0
    pause_s: float = 0.05  # a real model's time per token, so that the stream is seen arriving


@app.function(timeout_s=120)
def generate(p: Prompt) -> Iterator[dict]:
    """Yields one token at a time, each with its index and when it was made: the caller gets it at once."""
    rng = random.Random(p.seed)  # the same prompt and seed, the same text
    word = p.prompt.split()[-1] if p.prompt.split() else "the"
    for i in range(max(0, min(p.max_tokens, 256))):
        word = rng.choice(TABLE.get(word, ["the"]))
        time.sleep(max(0.0, min(p.pause_s, 1.0)))
        yield {"i": i, "token": word, "at": time.time()}
