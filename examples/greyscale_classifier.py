"""A greyscale image model declared to portkit: LeNet-5, 1-channel 32x32 images in, ten logits out.

    portkit run --model examples/greyscale_classifier.py:build --target neuron --target tpu
    portkit run --model examples/greyscale_classifier.py:build --target tpu -p corpus path/to/photos

LeNet-5 takes 32x32 greyscale images (LeCun et al., "Gradient-based learning applied to document
recognition", 1998). Its declaration is `inputs.image_declaration(32, ..., channels=1, mean=..., std=...)`:
one input, (batch, 1, 32, 32) float32, no dimension but the batch varies, so stage 3 has nothing to bucket.
The weights are random (seeded); the images are real: crops of the photographs matplotlib ships, or every
image below the folder given as `-p corpus`, grey or colour (a colour image becomes its ITU-R BT.601
luminance before the model sees it).
"""
from __future__ import annotations

import torch
from torch import nn

from portkit import models
from portkit.models import inputs

SIZE = 32
# The normalisation of PyTorch's MNIST example (github.com/pytorch/examples, mnist/main.py): the mean and
# standard deviation of MNIST's greyscale pixels in [0, 1].
MEAN, STD = (0.1307,), (0.3081,)


class LeNet5(nn.Module):
    """Two convolution and pooling stages and three linear layers, as in the 1998 paper (max pooling, ReLU)."""

    def __init__(self, classes: int = 10):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(1, 6, 5), nn.ReLU(), nn.MaxPool2d(2),     # 32 -> 28 -> 14
                                      nn.Conv2d(6, 16, 5), nn.ReLU(), nn.MaxPool2d(2))    # 14 -> 10 -> 5
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(16 * 5 * 5, 120), nn.ReLU(),
                                  nn.Linear(120, 84), nn.ReLU(), nn.Linear(84, classes))

    def forward(self, pixel_values):
        return {"logits": self.head(self.features(pixel_values))}


DECLARATION = inputs.image_declaration(SIZE, (inputs.Output("logits", inputs.IMAGE_CLASSIFIER),),
                                       channels=1, mean=MEAN, std=STD)


def build() -> models.LoadedModel:
    torch.manual_seed(0)
    return models.LoadedModel("greyscale-lenet5", inputs.IMAGE_CLASSIFIER, LeNet5().eval(),
                              "random weights (seed 0), examples/greyscale_classifier.py", image_size=SIZE,
                              declaration=DECLARATION)
