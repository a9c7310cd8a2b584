"""Transformer and sequence workloads of the benchmark suite (W10-W12 of the workload list): the
zoo's GPT block and GPT, and the same modules written in PyTorch, with the same initial weights;
the LSTM of bench_sequence.py."""
import numpy as np

import metagraph as mg
import metagraph.nn.functional as F
from metagraph.bench_sequence import lstm_workload

BATCH, TIME, D_MODEL, HEADS, HIDDEN = 8, 128, 256, 4, 1024
GPT_BATCH, GPT_CONTEXT = 32, 128


def _torch_modules(torch):
    nn = torch.nn

    class Block(nn.Module):
        def __init__(self, d_model, heads, hidden=None):
            super().__init__()
            self.heads = heads
            self.ln1, self.ln2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
            self.qkv, self.proj = nn.Linear(d_model, 3 * d_model), nn.Linear(d_model, d_model)
            self.fc1, self.fc2 = nn.Linear(d_model, hidden or 4 * d_model), nn.Linear(hidden or 4 * d_model,
                                                                                     d_model)

        def forward(self, x, mask=None):
            b, t, d = x.shape
            q, k, v = self.qkv(self.ln1(x)).reshape(b, t, 3, self.heads, d // self.heads) \
                .permute(2, 0, 3, 1, 4)
            scores = q @ k.transpose(-1, -2) * (1.0 / (d // self.heads) ** 0.5)
            if mask is not None:
                scores = scores + mask
            attended = torch.softmax(scores, dim=-1) @ v
            x = x + self.proj(attended.permute(0, 2, 1, 3).reshape(b, t, d))
            return x + self.fc2(torch.nn.functional.gelu(self.fc1(self.ln2(x))))

    class GPT(nn.Module):
        def __init__(self, vocab, context, d_model, heads, layers):
            super().__init__()
            self.tokens, self.positions = nn.Embedding(vocab, d_model), nn.Embedding(context, d_model)
            self.blocks = nn.ModuleList([Block(d_model, heads) for _ in range(layers)])
            self.norm, self.head = nn.LayerNorm(d_model), nn.Linear(d_model, vocab)
            self.register_buffer("causal", torch.triu(torch.full((context, context), float("-inf")), 1))

        def forward(self, idx):
            t = idx.shape[-1]
            x = self.tokens(idx) + self.positions(torch.arange(t))
            for block in self.blocks:
                x = block(x, self.causal[:t, :t])
            return self.head(self.norm(x))
    return Block, GPT


def _copy_weights(torch, ours, theirs):
    """Give the PyTorch module metagraph's initial weights (the same state_dict keys)."""
    state = {key: torch.from_numpy(np.array(value.numpy())) for key, value in ours.state_dict().items()}
    theirs.load_state_dict(state, strict=False)


def _block_workload(train):
    def workload(torch):
        data = np.random.default_rng(0).standard_normal((BATCH, TIME, D_MODEL)).astype(np.float32)
        block, x = mg.models.gpt_block(D_MODEL, HEADS, HIDDEN), mg.tensor(data)

        def ours():
            if not train:
                with mg.no_grad():
                    return block(x).numpy()
            block(x).sum().backward()
            mg.sync(*(p.grad for p in block.parameters()))
        theirs = None
        if torch:
            reference, t = _torch_modules(torch)[0](D_MODEL, HEADS, HIDDEN), torch.from_numpy(data)
            _copy_weights(torch, block, reference)

            def theirs():
                if not train:
                    with torch.no_grad():
                        return reference(t).numpy()
                reference(t).sum().backward()
        return ours, theirs, "ms", None
    return workload


def training_step(compute_loss, optimizer):
    """One optimiser step as a workload call, for either framework: compute_loss(), then
    zero_grad, backward and step; returns the loss as a Python float (a sync point)."""
    def step():
        loss = compute_loss()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss.item()
    return step


def gpt_training(torch):
    """W11: one AdamW step of the examples' GPT on 32 x 128 random bytes; tokens per second."""
    tokens = np.random.default_rng(0).integers(0, 256, (GPT_BATCH, GPT_CONTEXT + 1))
    model = mg.models.gpt(256, GPT_CONTEXT)
    x, y = mg.tensor(tokens[:, :-1]), mg.tensor(tokens[:, 1:].reshape(-1))
    ours = training_step(lambda: F.cross_entropy(model(x).reshape(-1, 256), y),
                         mg.optim.AdamW(model.parameters(), lr=3e-4))
    theirs = None
    if torch:
        reference = _torch_modules(torch)[1](256, GPT_CONTEXT, 128, 4, 4)
        _copy_weights(torch, model, reference)
        tx, ty = torch.from_numpy(tokens[:, :-1]), torch.from_numpy(tokens[:, 1:].reshape(-1))
        theirs = training_step(lambda: torch.nn.functional.cross_entropy(reference(tx).reshape(-1, 256), ty),
                               torch.optim.AdamW(reference.parameters(), lr=3e-4))
    return ours, theirs, "tokens/s", GPT_BATCH * GPT_CONTEXT


def lstm(torch):
    """W12: a one-layer LSTM forward and backward (metagraph/bench_sequence.py)."""
    ours, theirs = lstm_workload()
    return ours, theirs if torch else None, "ms", None


WORKLOADS = {
    "W10f": ("transformer block forward, 8x128x256, 4 heads", _block_workload(train=False)),
    "W10b": ("transformer block forward+backward", _block_workload(train=True)),
    "W11": ("char GPT training step (4x128, 4 heads), 32x128 tokens", gpt_training),
    "W12": ("LSTM 64 -> 256, batch 32, sequence 64, forward+backward", lstm),
}
