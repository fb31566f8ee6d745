"""Small MLP classifier for scikit-learn's 8x8 digits dataset."""

import torch

INPUT_SIZE = 64
NUM_CLASSES = 10


class DigitsNet(torch.nn.Module):
    """64 raw pixels (0..16) -> 64 hidden (ReLU) -> 10 logits."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(INPUT_SIZE, 64)
        self.fc2 = torch.nn.Linear(64, NUM_CLASSES)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        x = pixels / 16.0
        return self.fc2(torch.relu(self.fc1(x)))


def load(path) -> DigitsNet:
    """Build a DigitsNet, load a state_dict from `path`, and put it in eval mode."""
    net = DigitsNet()
    net.load_state_dict(torch.load(path, weights_only=True))
    net.eval()
    return net
