"""A Hugging Face transformers model built from its config, inside an image: nothing is downloaded from the hub.

    ember dev examples/transformers_config/app.py
    ember call transformers-config.TinyGPT.generate --data '{"prompt": "Hello", "max_new_tokens": 8}'

The image installs torch and transformers on the node (the pushing machine needs neither). ``setup`` builds a
small GPT-2 from a ``GPT2Config`` with random weights (seeded, so every replica holds the same model) and a
byte-level vocabulary (256 tokens: a text's UTF-8 bytes), so no tokenizer or weights are fetched;
``HF_HUB_OFFLINE=1`` makes any attempt fail instead. To serve trained weights, put them in a volume and load them
with ``from_pretrained(<the mount>)``, as examples/onnx_classifier does with its model.

A node that should install the CPU build of torch rather than PyPI's CUDA one can be pointed at it (its uv reads
``UV_FIND_LINKS`` / ``UV_INDEX_URL``), or the image can say so: ``ember.Image(extra_index_urls=[
"https://download.pytorch.org/whl/cpu"])``.
"""

import msgspec
import torch  # only the image needs these two: a push from a machine without them still works
import transformers

import ember

image = ember.Image().pip_install("torch==2.13.0", "transformers==5.25.0").env({"HF_HUB_OFFLINE": "1"})
app = ember.App("transformers-config", image=image)

CONFIG = {"vocab_size": 256, "n_positions": 128, "n_embd": 64, "n_layer": 2, "n_head": 2, "bos_token_id": 0,
          "eos_token_id": None}  # no end token: it writes max_new_tokens bytes


class Prompt(msgspec.Struct):
    prompt: str
    max_new_tokens: int = 16


@app.model(timeout_s=120)
class TinyGPT:
    @ember.setup
    def load(self) -> None:
        torch.manual_seed(0)
        torch.set_num_threads(1)
        self.config = transformers.GPT2Config(**CONFIG)
        self.model = transformers.GPT2LMHeadModel(self.config).eval()

    @ember.method
    def generate(self, p: Prompt) -> dict:
        """Greedy decoding: the same prompt gives the same tokens on every replica."""
        ids = list(p.prompt.encode()[-64:]) or [0]
        n = max(1, min(p.max_new_tokens, 64))
        with torch.inference_mode():
            out = self.model.generate(torch.tensor([ids]), max_new_tokens=n, min_new_tokens=n, do_sample=False,
                                      pad_token_id=0)
        new = out[0, len(ids):].tolist()
        return {"tokens": new, "text": bytes(new).decode("utf-8", errors="replace"),
                "layers": self.config.n_layer, "parameters": sum(t.numel() for t in self.model.parameters()),
                "transformers": transformers.__version__}
