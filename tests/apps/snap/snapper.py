"""A class whose model is built in a zygote (``@ember.setup(snap=True)``) and finished per replica."""

import os

import ember

app = ember.App("snapper")


@app.model(min_replicas=1, max_replicas=3)
class Model:
    @ember.setup(snap=True)
    def load(self) -> None:
        import torch

        print("building the model")  # a zygote's own output comes before it announces that it is ready
        torch.manual_seed(0)  # the same weights in a zygote and in a fresh replica
        self.net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2)).eval()
        self.built_by = int(os.environ.get("EMBER_HOST_PID") or os.getpid())  # in a sandbox: its pid on the node

    @ember.setup
    def place(self) -> None:
        self.serving_pid = int(os.environ.get("EMBER_HOST_PID") or os.getpid())

    @ember.method
    def predict(self, x: list[float]) -> dict:
        import torch

        with torch.inference_mode():
            y = self.net(torch.tensor([x], dtype=torch.float32))[0].tolist()
        return {"y": y, "built_by": self.built_by, "pid": self.serving_pid, "env": os.environ.get("EMBER_DEVICE")}
