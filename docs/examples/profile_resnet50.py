"""`deepres profile docs/examples/profile_resnet50.py:build`: torchvision's ResNet-50, SGD with
momentum, a batch of 64 images of 224 px, cross-entropy."""

import torch
import torchvision
from torch import nn


def build():
    model = torchvision.models.resnet50(weights=None)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    batch = (torch.randn(64, 3, 224, 224), torch.randint(0, 1000, (64,)))
    return model, optimizer, batch, nn.functional.cross_entropy
