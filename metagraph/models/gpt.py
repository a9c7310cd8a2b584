"""A small GPT (decoder-only transformer): token and position embeddings, pre-norm blocks of
multi-head self-attention and a GELU MLP, a final norm and a linear head. Written from the
composites a user has (Linear, LayerNorm, softmax, matmul), so its speed is the framework's."""
import math

import numpy as np

import metagraph as mg
import metagraph.nn.functional as F
from metagraph import nn


class Block(nn.Module):
    """Pre-norm transformer block: self-attention (q, k, v from one projection) and a GELU MLP of
    `hidden` units, each added to its input. `mask` (additive, broadcast over the heads) makes the
    attention causal; None attends everywhere."""

    def __init__(self, d_model, heads, hidden=None):
        super().__init__()
        if d_model % heads:
            raise mg.ArgumentError(f"Block: d_model {d_model} is not a multiple of heads {heads}")
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.qkv, self.proj = nn.Linear(d_model, 3 * d_model), nn.Linear(d_model, d_model)
        hidden = hidden or 4 * d_model
        self.fc1, self.fc2 = nn.Linear(d_model, hidden), nn.Linear(hidden, d_model)

    def forward(self, x, mask=None):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).reshape(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        scores = q @ k.transpose(-1, -2) * (1.0 / math.sqrt(d // self.heads))
        if mask is not None:
            scores = scores + mask
        attended = F.softmax(scores, dim=-1) @ v
        x = x + self.proj(attended.permute(0, 2, 1, 3).reshape(b, t, d))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class GPT(nn.Module):
    """A causal language model over `vocab` tokens with a context of up to `context` tokens."""

    def __init__(self, vocab, context, d_model=128, heads=4, layers=4):
        super().__init__()
        self.context = context
        self.tokens, self.positions = nn.Embedding(vocab, d_model), nn.Embedding(context, d_model)
        self.blocks = nn.ModuleList([Block(d_model, heads) for _ in range(layers)])
        self.norm, self.head = nn.LayerNorm(d_model), nn.Linear(d_model, vocab)
        # an attribute, not a buffer: recomputed, never saved
        self.causal = mg.tensor(np.triu(np.full((context, context), -np.inf, dtype=np.float32), 1))

    def forward(self, idx):
        """Logits of the next token at every position of `idx` (batch, time)."""
        t = idx.shape[-1]
        if t > self.context:
            raise mg.ShapeError(f"GPT: {t} tokens exceed the context of {self.context}")
        x = self.tokens(idx) + self.positions(mg.arange(t))
        mask = self.causal[:t, :t]
        for block in self.blocks:
            x = block(x, mask)
        return self.head(self.norm(x))


def gpt(vocab=256, context=128, d_model=128, heads=4, layers=4):
    """The examples' character-level GPT (4 layers, d_model 128, 4 heads, context 128)."""
    return GPT(vocab, context, d_model, heads, layers)


def gpt_block(d_model=256, heads=4, hidden=1024):
    """One pre-norm block (the benchmark's transformer block: 256 wide, 4 heads, MLP 1024)."""
    return Block(d_model, heads, hidden)
