"""VGG (Simonyan & Zisserman 2014) in torchvision's layout."""
from metagraph import nn

CONFIGS = {
    11: [64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"],
    13: [64, 64, "M", 128, 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"],
    16: [64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M"],
    19: [64, 64, "M", 128, 128, "M", 256, 256, 256, 256, "M", 512, 512, 512, 512, "M",
         512, 512, 512, 512, "M"],
}


def _features(config, batch_norm):
    layers, channels = [], 3
    for v in config:
        if v == "M":
            layers.append(nn.MaxPool2d(2, stride=2))
            continue
        layers.append(nn.Conv2d(channels, v, 3, padding=1))
        if batch_norm:
            layers.append(nn.BatchNorm2d(v))
        layers.append(nn.ReLU())
        channels = v
    return nn.Sequential(*layers)


class VGG(nn.Module):
    def __init__(self, features, num_classes=1000, dropout=0.5):
        super().__init__()
        self.features = features
        self.avgpool = nn.AdaptiveAvgPool2d((7, 7))
        self.classifier = nn.Sequential(nn.Linear(512 * 7 * 7, 4096), nn.ReLU(), nn.Dropout(dropout),
                                        nn.Linear(4096, 4096), nn.ReLU(), nn.Dropout(dropout),
                                        nn.Linear(4096, num_classes))
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")
                nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, 0.0, 0.01)
                nn.init.zeros_(module.bias)

    def forward(self, x):
        return self.classifier(self.avgpool(self.features(x)).flatten(1))


def _vgg(depth, batch_norm, num_classes):
    return VGG(_features(CONFIGS[depth], batch_norm), num_classes)


def vgg11(num_classes=1000):
    return _vgg(11, False, num_classes)


def vgg11_bn(num_classes=1000):
    return _vgg(11, True, num_classes)


def vgg13(num_classes=1000):
    return _vgg(13, False, num_classes)


def vgg13_bn(num_classes=1000):
    return _vgg(13, True, num_classes)


def vgg16(num_classes=1000):
    return _vgg(16, False, num_classes)


def vgg16_bn(num_classes=1000):
    return _vgg(16, True, num_classes)


def vgg19(num_classes=1000):
    return _vgg(19, False, num_classes)


def vgg19_bn(num_classes=1000):
    return _vgg(19, True, num_classes)
