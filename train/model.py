"""The CNN of pytorch/examples' MNIST: two conv layers, dropout, two linear layers, log-softmax."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F


WIDTH = 32  # pytorch/examples': the first convolution's channels


class Net(nn.Module):
    """``width`` channels in the first convolution, twice as many in the second, four times as many hidden units:
    32 is the seed's CNN; a narrower one trains several times cheaper where accuracy is not the point."""

    def __init__(self, width: int = WIDTH) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, width, 3, 1)
        self.conv2 = nn.Conv2d(width, 2 * width, 3, 1)
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(2 * width * 12 * 12, 4 * width)
        self.fc2 = nn.Linear(4 * width, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.conv1(x))
        x = F.relu(self.conv2(x))
        x = self.dropout1(F.max_pool2d(x, 2))
        x = self.dropout2(F.relu(self.fc1(torch.flatten(x, 1))))
        return F.log_softmax(self.fc2(x), dim=1)


def build_optimizer(parameters, lr: float) -> torch.optim.Optimizer:  # type: ignore[no-untyped-def]
    return torch.optim.AdamW(parameters, lr=lr)
