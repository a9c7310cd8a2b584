"""Model zoo with torchvision's constructors and state_dict keys, so its weights load, and the examples'
small GPT."""
from metagraph.models.alexnet import AlexNet, alexnet
from metagraph.models.gpt import GPT, Block as GPTBlock, gpt, gpt_block
from metagraph.models.mobilenet import MobileNetV2, mobilenet_v2
from metagraph.models.resnet import ResNet, resnet18, resnet34, resnet50, resnet101, resnet152
from metagraph.models.vgg import VGG, vgg11, vgg11_bn, vgg13, vgg13_bn, vgg16, vgg16_bn, vgg19, vgg19_bn
