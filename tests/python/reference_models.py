"""The Python modules lockstep's reference models mirror, key for key (see docs/models.md).

Used by tests: `python3 reference_models.py MODEL STATE_DICT_FILE` loads a state dict written by
lockstep (--save-model) with torch.load, loads it strictly into the Python module and prints one
JSON line: the module's state_dict keys in order and its eval-mode logits for a fixed input
(torch.linspace(-1, 1) over a batch of two images), for the C++ side to compare.
"""
import json
import sys

import torch
import torch.nn as nn


class ConvNet(nn.Module):
    def __init__(self, num_classes=10):
        super().__init__()
        self.layer1 = nn.Sequential(nn.Conv2d(1, 16, 5, 1, 2), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2))
        self.layer2 = nn.Sequential(nn.Conv2d(16, 32, 5, 1, 2), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2))
        self.fc = nn.Linear(7 * 7 * 32, num_classes)

    def forward(self, x):
        return self.fc(self.layer2(self.layer1(x)).flatten(1))


class MLP(nn.Module):
    def __init__(self, num_classes=10):
        super().__init__()
        self.fc1 = nn.Linear(784, 256)
        self.fc2 = nn.Linear(256, num_classes)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x.flatten(1))))


class WideMLP(nn.Module):
    def __init__(self, num_classes=10):
        super().__init__()
        self.fc1 = nn.Linear(784, 4096)
        self.fc2 = nn.Linear(4096, 1024)
        self.fc3 = nn.Linear(1024, num_classes)

    def forward(self, x):
        return self.fc3(torch.relu(self.fc2(torch.relu(self.fc1(x.flatten(1))))))


class BasicBlock(nn.Module):
    def __init__(self, in_planes, planes, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = None
        if stride != 1 or in_planes != planes:
            self.downsample = nn.Sequential(nn.Conv2d(in_planes, planes, 1, stride, bias=False), nn.BatchNorm2d(planes))

    def forward(self, x):
        out = self.bn2(self.conv2(torch.relu(self.bn1(self.conv1(x)))))
        return torch.relu(out + (self.downsample(x) if self.downsample is not None else x))


class ResNet18(nn.Module):
    """torchvision's resnet18 with a 3x3 stride-1 stem and no max pool, for 3x32x32 inputs."""

    def __init__(self, num_classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        def stage(i, o, s):
            return nn.Sequential(BasicBlock(i, o, s), BasicBlock(o, o, 1))
        self.layer1, self.layer2 = stage(64, 64, 1), stage(64, 128, 2)
        self.layer3, self.layer4 = stage(128, 256, 2), stage(256, 512, 2)
        self.fc = nn.Linear(512, num_classes)

    def forward(self, x):
        x = torch.relu(self.bn1(self.conv1(x)))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))


MODELS = {"convnet": (ConvNet, (1, 28, 28)), "mlp": (MLP, (1, 28, 28)), "mlp-wide": (WideMLP, (1, 28, 28)), "resnet18": (ResNet18, (3, 32, 32))}


def main():
    name, path = sys.argv[1], sys.argv[2]
    cls, shape = MODELS[name]
    model = cls()
    state = torch.load(path)
    if not isinstance(state, dict):
        raise SystemExit(f"torch.load({path!r}) returned {type(state).__name__}, not a dict")
    model.load_state_dict(state, strict=True)
    model.eval()
    x = torch.linspace(-1, 1, 2 * shape[0] * shape[1] * shape[2]).reshape(2, *shape)
    with torch.no_grad():
        logits = model(x)
    print(json.dumps({"keys": list(model.state_dict().keys()), "loaded_keys": list(state.keys()),
                      "logits": logits.flatten().tolist()}))


if __name__ == "__main__":
    main()
