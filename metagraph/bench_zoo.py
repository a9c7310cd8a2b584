"""Model-zoo workloads of the benchmark suite (metagraph.bench wires them in): inference of
metagraph.models' networks beside the same networks written here in PyTorch, without torchvision.
The PyTorch twins keep torchvision's layout, as the zoo does, so metagraph's state_dict loads into
them unchanged: both sides compute the same thing from the same weights.

Z1       ResNet-50 inference, batch 4, 224^2.
Z2a-Z2e  batch-1 inference at 224^2 of ResNet-18, ResNet-50, MobileNetV2, AlexNet and VGG-11;
Z2       their geometric mean (images/s and ratio), when more than one of them ran.
W5 and W9 (ResNet-18 batch 8, VGG-11 batch 4) and W6's PyTorch ResNet-18 are built here too.
"""
import statistics
from functools import partial

import metagraph as mg
from metagraph.bench_kernels import random_array
from metagraph.bench_transformer import _copy_weights
from metagraph.models.mobilenet import MobileNetV2, _divisible
from metagraph.models.vgg import CONFIGS as VGG_CONFIGS


def _stacked(torch, features, pool, classifier):
    """classifier(flatten(pool(features(x)))): the shape of VGG, AlexNet and MobileNetV2."""
    class Stacked(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.features, self.avgpool, self.classifier = features, pool, classifier

        def forward(self, x):
            return self.classifier(torch.flatten(self.avgpool(self.features(x)), 1))
    return Stacked()


def torch_resnet(torch, layers, bottleneck=False, num_classes=1000):
    """ResNet with `layers` blocks per stage (basic blocks, or bottlenecks with the stride on their
    3x3 conv, as torchvision's v1.5)."""
    nn, expansion = torch.nn, 4 if bottleneck else 1

    def conv_bn(inp, out, kernel, stride=1):
        return nn.Conv2d(inp, out, kernel, stride, kernel // 2, bias=False), nn.BatchNorm2d(out)

    class Block(nn.Module):
        def __init__(self, inp, planes, stride, downsample):
            super().__init__()
            if bottleneck:
                self.conv1, self.bn1 = conv_bn(inp, planes, 1)
                self.conv2, self.bn2 = conv_bn(planes, planes, 3, stride)
                self.conv3, self.bn3 = conv_bn(planes, planes * expansion, 1)
            else:
                self.conv1, self.bn1 = conv_bn(inp, planes, 3, stride)
                self.conv2, self.bn2 = conv_bn(planes, planes, 3)
            self.downsample = downsample

        def forward(self, x):
            out = self.bn2(self.conv2(torch.relu(self.bn1(self.conv1(x)))))
            if bottleneck:
                out = self.bn3(self.conv3(torch.relu(out)))
            return torch.relu(out + (x if self.downsample is None else self.downsample(x)))

    class ResNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1, self.bn1 = conv_bn(3, 64, 7, 2)
            self.maxpool, self.avgpool = nn.MaxPool2d(3, 2, 1), nn.AdaptiveAvgPool2d(1)
            inp = 64
            for stage, (planes, blocks) in enumerate(zip((64, 128, 256, 512), layers)):
                stride, out = 1 if stage == 0 else 2, planes * expansion
                downsample = None
                if stride != 1 or inp != out:
                    downsample = nn.Sequential(*conv_bn(inp, out, 1, stride))
                stack = [Block(inp, planes, stride, downsample)] + [Block(out, planes, 1, None)
                                                                    for _ in range(1, blocks)]
                setattr(self, f"layer{stage + 1}", nn.Sequential(*stack))
                inp = out
            self.fc = nn.Linear(512 * expansion, num_classes)

        def forward(self, x):
            x = self.maxpool(torch.relu(self.bn1(self.conv1(x))))
            x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
            return self.fc(torch.flatten(self.avgpool(x), 1))
    return ResNet()


def torch_vgg(torch, depth, num_classes=1000):
    """VGG-`depth` without batch norm."""
    nn, layers, channels = torch.nn, [], 3
    for v in VGG_CONFIGS[depth]:
        if v == "M":
            layers.append(nn.MaxPool2d(2))
            continue
        layers += [nn.Conv2d(channels, v, 3, padding=1), nn.ReLU()]
        channels = v
    classifier = nn.Sequential(nn.Linear(512 * 49, 4096), nn.ReLU(), nn.Dropout(), nn.Linear(4096, 4096),
                               nn.ReLU(), nn.Dropout(), nn.Linear(4096, num_classes))
    return _stacked(torch, nn.Sequential(*layers), nn.AdaptiveAvgPool2d(7), classifier)


def torch_alexnet(torch, num_classes=1000):
    """AlexNet."""
    nn = torch.nn
    features = nn.Sequential(
        nn.Conv2d(3, 64, 11, 4, 2), nn.ReLU(), nn.MaxPool2d(3, 2),
        nn.Conv2d(64, 192, 5, padding=2), nn.ReLU(), nn.MaxPool2d(3, 2),
        nn.Conv2d(192, 384, 3, padding=1), nn.ReLU(),
        nn.Conv2d(384, 256, 3, padding=1), nn.ReLU(),
        nn.Conv2d(256, 256, 3, padding=1), nn.ReLU(), nn.MaxPool2d(3, 2))
    classifier = nn.Sequential(nn.Dropout(), nn.Linear(256 * 36, 4096), nn.ReLU(), nn.Dropout(),
                               nn.Linear(4096, 4096), nn.ReLU(), nn.Linear(4096, num_classes))
    return _stacked(torch, features, nn.AdaptiveAvgPool2d(6), classifier)


def torch_mobilenet_v2(torch, num_classes=1000):
    """MobileNetV2 at width 1 (the zoo's settings table)."""
    nn = torch.nn

    def conv_bn_relu6(inp, out, kernel=3, stride=1, groups=1):
        return nn.Sequential(nn.Conv2d(inp, out, kernel, stride, kernel // 2, groups=groups, bias=False),
                             nn.BatchNorm2d(out), nn.ReLU6())

    class InvertedResidual(nn.Module):
        def __init__(self, inp, out, stride, expand_ratio):
            super().__init__()
            hidden = int(round(inp * expand_ratio))
            self.residual = stride == 1 and inp == out
            layers = [conv_bn_relu6(inp, hidden, kernel=1)] if expand_ratio != 1 else []
            layers += [conv_bn_relu6(hidden, hidden, stride=stride, groups=hidden),
                       nn.Conv2d(hidden, out, 1, bias=False), nn.BatchNorm2d(out)]
            self.conv = nn.Sequential(*layers)

        def forward(self, x):
            return x + self.conv(x) if self.residual else self.conv(x)
    channels, last = _divisible(32), _divisible(1280)
    layers = [conv_bn_relu6(3, channels, stride=2)]
    for t, c, n, s in MobileNetV2.SETTINGS:
        for i in range(n):
            layers.append(InvertedResidual(channels, _divisible(c), s if i == 0 else 1, t))
            channels = _divisible(c)
    layers.append(conv_bn_relu6(channels, last, kernel=1))
    classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(last, num_classes))
    return _stacked(torch, nn.Sequential(*layers), nn.AdaptiveAvgPool2d(1), classifier)


# zoo name -> (metagraph constructor, PyTorch twin constructor); both take num_classes
ZOO = {
    "resnet18": (mg.models.resnet18, partial(torch_resnet, layers=(2, 2, 2, 2))),
    "resnet50": (mg.models.resnet50, partial(torch_resnet, layers=(3, 4, 6, 3), bottleneck=True)),
    "mobilenet_v2": (mg.models.mobilenet_v2, torch_mobilenet_v2),
    "alexnet": (mg.models.alexnet, torch_alexnet),
    "vgg11": (mg.models.vgg11, partial(torch_vgg, depth=11)),
}


def twin(torch, name, model, num_classes=1000):
    """The PyTorch twin of zoo network `name`, holding `model`'s weights, in eval mode."""
    reference = ZOO[name][1](torch, num_classes=num_classes)
    _copy_weights(torch, model, reference)
    return reference.eval()


def inference(name, batch):
    """A workload: images/s of zoo network `name` (eval mode, no gradients) on a batch at 224^2."""
    def workload(torch):
        data = random_array(batch, 3, 224, 224)
        model, x = ZOO[name][0]().eval(), mg.tensor(data)

        def ours():
            with mg.no_grad():
                return model(x).numpy()
        theirs = None
        if torch:
            reference, t = twin(torch, name, model), torch.from_numpy(data)

            def theirs():
                with torch.no_grad():
                    return reference(t).numpy()
        return ours, theirs, "images/s", batch
    return workload


BATCH_ONE = {
    "Z2a": ("ResNet-18 inference, batch 1, 224^2", inference("resnet18", 1)),
    "Z2b": ("ResNet-50 inference, batch 1, 224^2", inference("resnet50", 1)),
    "Z2c": ("MobileNetV2 inference, batch 1, 224^2", inference("mobilenet_v2", 1)),
    "Z2d": ("AlexNet inference, batch 1, 224^2", inference("alexnet", 1)),
    "Z2e": ("VGG-11 inference, batch 1, 224^2", inference("vgg11", 1)),
}

WORKLOADS = {
    "Z1": ("ResNet-50 inference, batch 4, 224^2", inference("resnet50", 4)),
    **BATCH_ONE,
}


def geometric_mean(rows):
    """The Z2 row: the geometric means of the batch-1 rows among `rows` (images/s, and the ratio when
    every one has PyTorch's figure), or None when fewer than two of them ran."""
    chosen = [row for row in rows if row["id"] in BATCH_ONE]
    if len(chosen) < 2:
        return None
    row = {"id": "Z2", "workload": f"geometric mean of {', '.join(row['id'] for row in chosen)}",
           "unit": "images/s", "metagraph": statistics.geometric_mean(row["metagraph"] for row in chosen)}
    if all("pytorch" in row for row in chosen):
        row["pytorch"] = statistics.geometric_mean(row["pytorch"] for row in chosen)
        row["ratio"] = statistics.geometric_mean(row["ratio"] for row in chosen)
    return row
