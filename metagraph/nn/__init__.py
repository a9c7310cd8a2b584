"""Neural-network building blocks, as torch.nn."""
from metagraph.nn import functional, init, utils
from metagraph.nn.layers import (CELU, ELU, Hardsigmoid, Hardswish, Hardtanh, Mish, PReLU, SELU, Softplus,
                                 AdaptiveAvgPool2d, AvgPool2d, BatchNorm1d, BatchNorm2d, BCEWithLogitsLoss,
                                 CrossEntropyLoss, Dropout, Embedding, Flatten, GELU,
                                 GroupNorm, Identity, L1Loss, LayerNorm, LeakyReLU, Linear, LogSoftmax,
                                 MaxPool2d, ModuleDict, ModuleList, MSELoss, NLLLoss, ReLU, ReLU6, Sequential,
                                 Sigmoid, SiLU, Softmax, Tanh)
from metagraph.nn.conv_nd import (Conv1d, Conv2d, Conv3d, ConvTranspose1d, ConvTranspose2d, ConvTranspose3d,
                                  Upsample)
from metagraph.nn.module import Module, Parameter
from metagraph.nn.rnn import GRU, GRUCell, LSTM, LSTMCell, RNN, RNNCell
from metagraph.nn.transformer import (MultiheadAttention, Transformer, TransformerDecoder,
                                      TransformerDecoderLayer, TransformerEncoder, TransformerEncoderLayer)
