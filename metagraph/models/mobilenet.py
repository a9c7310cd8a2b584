"""MobileNetV2 (Sandler et al. 2018) in torchvision's layout."""
from metagraph import nn


def _divisible(value, divisor=8):
    rounded = max(divisor, int(value + divisor / 2) // divisor * divisor)
    return rounded + divisor if rounded < 0.9 * value else rounded


def _conv_bn_relu6(inp, out, kernel=3, stride=1, groups=1):
    return nn.Sequential(nn.Conv2d(inp, out, kernel, stride, (kernel - 1) // 2, groups=groups, bias=False),
                         nn.BatchNorm2d(out), nn.ReLU6())


class InvertedResidual(nn.Module):
    def __init__(self, inp, out, stride, expand_ratio):
        super().__init__()
        hidden = int(round(inp * expand_ratio))
        self.use_residual = stride == 1 and inp == out
        layers = [_conv_bn_relu6(inp, hidden, kernel=1)] if expand_ratio != 1 else []
        layers += [_conv_bn_relu6(hidden, hidden, stride=stride, groups=hidden),
                   nn.Conv2d(hidden, out, 1, bias=False), nn.BatchNorm2d(out)]
        self.conv = nn.Sequential(*layers)

    def forward(self, x):
        return x + self.conv(x) if self.use_residual else self.conv(x)


class MobileNetV2(nn.Module):
    SETTINGS = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2),
                (6, 320, 1, 1)]

    def __init__(self, num_classes=1000, width_mult=1.0, dropout=0.2):
        super().__init__()
        channels = _divisible(32 * width_mult)
        self.last_channel = _divisible(1280 * max(1.0, width_mult))
        layers = [_conv_bn_relu6(3, channels, stride=2)]
        for t, c, n, s in self.SETTINGS:
            out = _divisible(c * width_mult)
            for i in range(n):
                layers.append(InvertedResidual(channels, out, s if i == 0 else 1, t))
                channels = out
        layers.append(_conv_bn_relu6(channels, self.last_channel, kernel=1))
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(nn.Dropout(dropout), nn.Linear(self.last_channel, num_classes))
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out")
            elif isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, 0.0, 0.01)
                nn.init.zeros_(module.bias)

    def forward(self, x):
        x = self.features(x)
        return self.classifier(nn.functional.adaptive_avg_pool2d(x, 1).flatten(1))


def mobilenet_v2(num_classes=1000):
    return MobileNetV2(num_classes)
