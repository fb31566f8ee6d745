"""A model on the GPU its node gives its replica (tests/integration/test_gpu_replicas.py): a small seeded MLP,
loaded on the CPU by a snap setup and moved to the replica's device in each replica, as examples/digits does (a
zygote runs the snap setup, and its replicas fork from it: on a sandboxed node, a zygote whose sandbox holds their
GPU's device nodes)."""

import os

import msgspec

import ember
from ember.backends import torch as et

app = ember.App("gpu-probe")
SEED = 0


class Row(msgspec.Struct):
    x: list[float]


class Out(msgspec.Struct):
    y: list[float]
    device: str  # where the forward pass ran: "cuda:0" on a GPU
    visible: str  # the replica's CUDA_VISIBLE_DEVICES: the GPU its node gave it


def build():
    """8 -> 16 -> 4, the same weights in every process (seeded)."""
    import torch

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))


@app.model(gpu=1, min_replicas=1, timeout_s=120)
class Probe:
    @ember.setup(snap=True)
    def load(self) -> None:
        """In the zygote, on the CPU: CUDA does not survive a fork, so the GPU is touched only after it."""
        self.net = et.load_module(build, device="cpu")

    @ember.setup
    def to_device(self) -> None:
        self.net = et.load_module(self.net)

    @ember.method(batch=ember.Batch(max_size=8, window_ms=5))
    def forward(self, rows: list[Row]) -> list[Out]:
        with et.inference():
            x, n = et.stack([row.x for row in rows], dtype="float32")
            y = self.net(x)
        visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
        return [Out(y=list(out), device=str(y.device), visible=visible) for out in et.unstack(y, n, tolist=True)]
