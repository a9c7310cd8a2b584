"""MultiheadAttention and the Transformer modules, with PyTorch's constructors, submodule and
parameter names (so that torch state_dicts load), initialisation and forward semantics.

Built from the existing composites only: projections are linear layers, heads are reshape and
permute views, attention is ops/attention.py (q @ k^T, softmax, @ v), plus layer_norm and dropout.
"""
import copy

from metagraph import creation, dtypes
from metagraph.errors import ArgumentError, DTypeError, ShapeError
from metagraph.nn import functional as F, init
from metagraph.nn.layers import Dropout, LayerNorm, Linear, ModuleList
from metagraph.nn.module import Module, Parameter
from metagraph.ops import attention as at, movement as mv
from metagraph.tensor import Tensor


class MultiheadAttention(Module):
    """PyTorch's nn.MultiheadAttention: in_proj_weight (3E, E) and in_proj_bias (3E,), or
    q/k/v_proj_weight when kdim or vdim differ from embed_dim; out_proj a Linear. Masks: bool
    True (or -inf) marks a key NOT to attend, a float mask is added to the scores."""

    def __init__(self, embed_dim, num_heads, dropout=0.0, bias=True, add_bias_kv=False, add_zero_attn=False,
                 kdim=None, vdim=None, batch_first=False, device=None, dtype=None):
        super().__init__()
        if embed_dim <= 0 or num_heads <= 0:
            raise ArgumentError(f"MultiheadAttention: embed_dim and num_heads must be greater than 0, got "
                                f"embed_dim={embed_dim} and num_heads={num_heads}")
        if embed_dim % num_heads:
            raise ArgumentError(f"MultiheadAttention: embed_dim {embed_dim} must be divisible by "
                                f"num_heads {num_heads}")
        self.embed_dim, self.num_heads, self.head_dim = embed_dim, num_heads, embed_dim // num_heads
        self.kdim = kdim if kdim is not None else embed_dim
        self.vdim = vdim if vdim is not None else embed_dim
        self._qkv_same_embed_dim = self.kdim == embed_dim and self.vdim == embed_dim
        self.dropout, self.batch_first, self.add_zero_attn = dropout, batch_first, add_zero_attn
        if self._qkv_same_embed_dim:
            self.in_proj_weight = Parameter(creation.zeros(3 * embed_dim, embed_dim))
            for name in ("q_proj_weight", "k_proj_weight", "v_proj_weight"):
                self.register_parameter(name, None)
        else:
            self.register_parameter("in_proj_weight", None)
            self.q_proj_weight = Parameter(creation.zeros(embed_dim, embed_dim))
            self.k_proj_weight = Parameter(creation.zeros(embed_dim, self.kdim))
            self.v_proj_weight = Parameter(creation.zeros(embed_dim, self.vdim))
        if bias:
            self.in_proj_bias = Parameter(creation.zeros(3 * embed_dim))
        else:
            self.register_parameter("in_proj_bias", None)
        self.out_proj = Linear(embed_dim, embed_dim, bias=bias)
        if add_bias_kv:
            self.bias_k = Parameter(creation.zeros(1, 1, embed_dim))
            self.bias_v = Parameter(creation.zeros(1, 1, embed_dim))
        else:
            self.bias_k = self.bias_v = None
        self._reset_parameters()

    def _reset_parameters(self):
        """PyTorch's: xavier_uniform_ projections, zero biases (out_proj's weight keeps Linear's
        initialisation), xavier_normal_ bias_k and bias_v."""
        if self._qkv_same_embed_dim:
            init.xavier_uniform_(self.in_proj_weight)
        else:
            for weight in (self.q_proj_weight, self.k_proj_weight, self.v_proj_weight):
                init.xavier_uniform_(weight)
        if self.in_proj_bias is not None:
            init.zeros_(self.in_proj_bias)
            init.zeros_(self.out_proj.bias)
        if self.bias_k is not None:
            init.xavier_normal_(self.bias_k)
            init.xavier_normal_(self.bias_v)

    def forward(self, query, key, value, key_padding_mask=None, need_weights=True, attn_mask=None,
                average_attn_weights=True, is_causal=False):
        """(output, attention weights averaged over heads unless average_attn_weights=False, or
        None when need_weights=False); inputs (L, N, E), or (N, L, E) with batch_first, or
        unbatched (L, E)."""
        batched = self._check(query, key, value, key_padding_mask, attn_mask)
        if not batched:            # a batch of one, batch first
            query, key, value = query.unsqueeze(0), key.unsqueeze(0), value.unsqueeze(0)
            key_padding_mask = key_padding_mask.unsqueeze(0) if key_padding_mask is not None else None
        first = self.batch_first or not batched
        batch, length = query.shape[1 - first], query.shape[first]
        dtype = query.dtype
        key_padding_mask = _additive(key_padding_mask, "key_padding_mask", dtype)
        if is_causal and attn_mask is None:
            raise ArgumentError("MultiheadAttention: is_causal is a hint that attn_mask is the causal mask; "
                                "pass the mask too (Transformer.generate_square_subsequent_mask)")
        if is_causal and key_padding_mask is None and not need_weights:
            attn_mask = None       # scaled_dot_product_attention builds the causal mask itself
        else:
            attn_mask, is_causal = _additive(attn_mask, "attn_mask", dtype), False
        q, k, v = self._project(query, key, value)
        if self.bias_k is not None:
            k, v = _append(k, self.bias_k, first), _append(v, self.bias_v, first)
            attn_mask, key_padding_mask = _pad_mask(attn_mask), _pad_mask(key_padding_mask)
        q, k, v = (self._heads(x, first) for x in (q, k, v))
        if self.add_zero_attn:
            k, v = F.pad(k, (0, 0, 0, 1)), F.pad(v, (0, 0, 0, 1))
            attn_mask, key_padding_mask = _pad_mask(attn_mask), _pad_mask(key_padding_mask)
        source = k.shape[2]
        mask = attn_mask               # (L, S) broadcasts over batch and heads; (N * heads, L, S) splits
        if attn_mask is not None and attn_mask.ndim == 3:
            mask = attn_mask.reshape(batch, self.num_heads, length, source)
        if key_padding_mask is not None:
            padding = key_padding_mask.reshape(batch, 1, 1, source)
            mask = padding if mask is None else mask + padding
        dropout_p = self.dropout if self.training else 0.0
        weights = None
        if need_weights:
            weights = Tensor(at.attention_weights(q.node, k.node, mask.node if mask is not None else None,
                                                  zero_masked_rows=False))
            heads = F.dropout(weights, dropout_p) @ v
            weights = weights.mean(1) if average_attn_weights else weights
            weights = weights if batched else weights.squeeze(0)
        else:
            heads = F.scaled_dot_product_attention(q, k, v, mask, dropout_p, is_causal)
        order = (0, 2, 1, 3) if first else (2, 0, 1, 3)
        merged = heads.permute(order)
        out = self.out_proj(merged.reshape(*merged.shape[:2], self.embed_dim))
        return (out if batched else out.squeeze(0)), weights

    def _check(self, query, key, value, key_padding_mask, attn_mask):
        """Whether the input is batched; fails where shapes do not fit, naming them."""
        name = "MultiheadAttention"
        if query.ndim not in (2, 3) or key.ndim != query.ndim or value.ndim != query.ndim:
            raise ShapeError(f"{name}: query, key and value must all be 3-D (batched) or 2-D (unbatched), "
                             f"got {query.shape}, {key.shape} and {value.shape}")
        for what, x, size in (("query", query, self.embed_dim), ("key", key, self.kdim),
                              ("value", value, self.vdim)):
            if x.shape[-1] != size:
                raise ShapeError(f"{name}: expected {what} of embedding size {size}, got shape {x.shape}")
        if key.shape[:-1] != value.shape[:-1]:
            raise ShapeError(f"{name}: key {key.shape} and value {value.shape} must match except in the "
                             "embedding size")
        batched = query.ndim == 3
        batch_axis = 0 if self.batch_first else 1
        if batched and query.shape[batch_axis] != key.shape[batch_axis]:
            raise ShapeError(f"{name}: query {query.shape} and key {key.shape} have different batch sizes")
        batch = query.shape[batch_axis] if batched else None
        source = key.shape[1 - batch_axis] if batched else key.shape[0]
        padding_shape = (batch, source) if batched else (source,)
        if key_padding_mask is not None and key_padding_mask.shape != padding_shape:
            raise ShapeError(f"{name}: expected key_padding_mask of shape {padding_shape}, got "
                             f"{key_padding_mask.shape}")
        if attn_mask is not None:
            length = query.shape[1 - batch_axis] if batched else query.shape[0]
            allowed = ((length, source), ((batch or 1) * self.num_heads, length, source))
            if attn_mask.shape not in allowed:
                raise ShapeError(f"{name}: attn_mask of shape {attn_mask.shape} should be {allowed[0]} or "
                                 f"{allowed[1]}")
        return batched

    def _project(self, query, key, value):
        """q, k, v in the inputs' layout; self-attention computes them as one linear (a wider
        contraction), as PyTorch does."""
        if self._qkv_same_embed_dim:
            if query is key and key is value:
                return F.linear(query, self.in_proj_weight, self.in_proj_bias).chunk(3, -1)
            weights = self.in_proj_weight.chunk(3)
        else:
            weights = (self.q_proj_weight, self.k_proj_weight, self.v_proj_weight)
        biases = self.in_proj_bias.chunk(3) if self.in_proj_bias is not None else (None,) * 3
        return tuple(F.linear(x, w, b) for x, w, b in zip((query, key, value), weights, biases))

    def _heads(self, x, first):
        """(N, heads, L, head_dim) view of a projection laid out (N, L, E) or (L, N, E)."""
        split = x.reshape(*x.shape[:2], self.num_heads, self.head_dim)
        return split.permute((0, 2, 1, 3) if first else (1, 2, 0, 3))

    def extra_repr(self):
        return f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, batch_first={self.batch_first}"


def _additive(mask, name, dtype):
    """A mask as PyTorch's _canonical_mask makes it: bool True becomes -inf, a float mask stays."""
    if mask is None:
        return None
    if mask.dtype == dtypes.bool_:
        return creation.zeros(*mask.shape, dtype=dtype).masked_fill(mask, float("-inf"))
    if mask.dtype != dtype:
        raise DTypeError(f"MultiheadAttention: {name} must be bool or of the query's dtype ({dtype.name}), "
                         f"got {mask.dtype.name}")
    return mask


def _pad_mask(mask):
    """A mask with a zero column for an appended key (bias_k, add_zero_attn)."""
    return F.pad(mask, (0, 1)) if mask is not None else None


def _append(x, bias, first):
    """x (N, S, E) or (S, N, E) with the (1, 1, E) bias appended along the sequence, per batch."""
    if first:
        return Tensor(mv.cat([x.node, bias.expand(x.shape[0], 1, x.shape[2]).node], 1))
    return Tensor(mv.cat([x.node, bias.expand(1, x.shape[1], x.shape[2]).node], 0))


def _activation(activation):
    """'relu', 'gelu' or a callable (a function or a module), as PyTorch's layers take it."""
    if activation == "relu":
        return F.relu
    if activation == "gelu":
        return F.gelu
    if isinstance(activation, str) or not callable(activation):
        raise ArgumentError(f"activation should be relu/gelu or a callable, not {activation!r}")
    return activation


class _TransformerLayer(Module):
    """The construction both layers share: self-attention (and, for the decoder, attention over the
    memory), the feed-forward block, one LayerNorm and one Dropout per residual block. Submodules
    are registered in PyTorch's order, which is the order of the state_dict's keys."""

    def __init__(self, d_model, nhead, dim_feedforward, dropout, activation, layer_norm_eps, batch_first,
                 norm_first, bias, cross_attention):
        super().__init__()
        self.self_attn = MultiheadAttention(d_model, nhead, dropout=dropout, bias=bias,
                                            batch_first=batch_first)
        if cross_attention:
            self.multihead_attn = MultiheadAttention(d_model, nhead, dropout=dropout, bias=bias,
                                                     batch_first=batch_first)
        self.linear1 = Linear(d_model, dim_feedforward, bias=bias)
        self.dropout = Dropout(dropout)
        self.linear2 = Linear(dim_feedforward, d_model, bias=bias)
        self.norm_first = norm_first
        blocks = range(1, 4 if cross_attention else 3)
        for block in blocks:
            setattr(self, f"norm{block}", LayerNorm(d_model, eps=layer_norm_eps, bias=bias))
        for block in blocks:
            setattr(self, f"dropout{block}", Dropout(dropout))
        self.activation = _activation(activation)

    def _sa_block(self, x, attn_mask, key_padding_mask, is_causal):
        x = self.self_attn(x, x, x, attn_mask=attn_mask, key_padding_mask=key_padding_mask,
                           need_weights=False, is_causal=is_causal)[0]
        return self.dropout1(x)

    def _ff_block(self, x, dropout):
        """The feed-forward block; `dropout` is the layer's last residual dropout."""
        return dropout(self.linear2(self.dropout(self.activation(self.linear1(x)))))


class TransformerEncoderLayer(_TransformerLayer):
    """Self-attention then a feed-forward block, each with a residual connection and a LayerNorm
    after it (before it with norm_first=True), as PyTorch's."""

    def __init__(self, d_model, nhead, dim_feedforward=2048, dropout=0.1, activation="relu",
                 layer_norm_eps=1e-5, batch_first=False, norm_first=False, bias=True, device=None,
                 dtype=None):
        super().__init__(d_model, nhead, dim_feedforward, dropout, activation, layer_norm_eps, batch_first,
                         norm_first, bias, cross_attention=False)

    def forward(self, src, src_mask=None, src_key_padding_mask=None, is_causal=False):
        x = src
        if self.norm_first:
            x = x + self._sa_block(self.norm1(x), src_mask, src_key_padding_mask, is_causal)
            return x + self._ff_block(self.norm2(x), self.dropout2)
        x = self.norm1(x + self._sa_block(x, src_mask, src_key_padding_mask, is_causal))
        return self.norm2(x + self._ff_block(x, self.dropout2))


class TransformerDecoderLayer(_TransformerLayer):
    """Self-attention, attention over the memory, then a feed-forward block, each with a residual
    connection and a LayerNorm, as PyTorch's."""

    def __init__(self, d_model, nhead, dim_feedforward=2048, dropout=0.1, activation="relu",
                 layer_norm_eps=1e-5, batch_first=False, norm_first=False, bias=True, device=None,
                 dtype=None):
        super().__init__(d_model, nhead, dim_feedforward, dropout, activation, layer_norm_eps, batch_first,
                         norm_first, bias, cross_attention=True)

    def forward(self, tgt, memory, tgt_mask=None, memory_mask=None, tgt_key_padding_mask=None,
                memory_key_padding_mask=None, tgt_is_causal=False, memory_is_causal=False):
        x = tgt
        if self.norm_first:
            x = x + self._sa_block(self.norm1(x), tgt_mask, tgt_key_padding_mask, tgt_is_causal)
            x = x + self._mha_block(self.norm2(x), memory, memory_mask, memory_key_padding_mask,
                                    memory_is_causal)
            return x + self._ff_block(self.norm3(x), self.dropout3)
        x = self.norm1(x + self._sa_block(x, tgt_mask, tgt_key_padding_mask, tgt_is_causal))
        x = self.norm2(x + self._mha_block(x, memory, memory_mask, memory_key_padding_mask, memory_is_causal))
        return self.norm3(x + self._ff_block(x, self.dropout3))

    def _mha_block(self, x, memory, attn_mask, key_padding_mask, is_causal):
        x = self.multihead_attn(x, memory, memory, attn_mask=attn_mask, key_padding_mask=key_padding_mask,
                                is_causal=is_causal, need_weights=False)[0]
        return self.dropout2(x)


class TransformerEncoder(Module):
    """num_layers deep copies of encoder_layer (same initial weights, as PyTorch's), then `norm`.
    enable_nested_tensor and mask_check are accepted and ignored: there is no nested tensor."""

    def __init__(self, encoder_layer, num_layers, norm=None, enable_nested_tensor=True, mask_check=True):
        super().__init__()
        self.layers = ModuleList(copy.deepcopy(encoder_layer) for _ in range(num_layers))
        self.num_layers, self.norm = num_layers, norm
        self.enable_nested_tensor, self.mask_check = enable_nested_tensor, mask_check

    def forward(self, src, mask=None, src_key_padding_mask=None, is_causal=None):
        """is_causal=None is False: PyTorch compares the mask with the causal one only to choose a
        faster path, and the result is the same."""
        output = src
        for layer in self.layers:
            output = layer(output, src_mask=mask, src_key_padding_mask=src_key_padding_mask,
                           is_causal=bool(is_causal))
        return self.norm(output) if self.norm is not None else output


class TransformerDecoder(Module):
    """num_layers deep copies of decoder_layer, then `norm`, as PyTorch's."""

    def __init__(self, decoder_layer, num_layers, norm=None):
        super().__init__()
        self.layers = ModuleList(copy.deepcopy(decoder_layer) for _ in range(num_layers))
        self.num_layers, self.norm = num_layers, norm

    def forward(self, tgt, memory, tgt_mask=None, memory_mask=None, tgt_key_padding_mask=None,
                memory_key_padding_mask=None, tgt_is_causal=None, memory_is_causal=False):
        output = tgt
        for layer in self.layers:
            output = layer(output, memory, tgt_mask=tgt_mask, memory_mask=memory_mask,
                           tgt_key_padding_mask=tgt_key_padding_mask,
                           memory_key_padding_mask=memory_key_padding_mask, tgt_is_causal=bool(tgt_is_causal),
                           memory_is_causal=memory_is_causal)
        return self.norm(output) if self.norm is not None else output


class Transformer(Module):
    """PyTorch's nn.Transformer: an encoder and a decoder (each ending in a LayerNorm); every
    parameter of two or more dimensions is re-initialised with xavier_uniform_."""

    def __init__(self, d_model=512, nhead=8, num_encoder_layers=6, num_decoder_layers=6,
                 dim_feedforward=2048, dropout=0.1, activation="relu", custom_encoder=None,
                 custom_decoder=None, layer_norm_eps=1e-5, batch_first=False, norm_first=False, bias=True,
                 device=None, dtype=None):
        super().__init__()
        options = (d_model, nhead, dim_feedforward, dropout, activation, layer_norm_eps, batch_first,
                   norm_first, bias)
        if custom_encoder is None:
            custom_encoder = TransformerEncoder(TransformerEncoderLayer(*options), num_encoder_layers,
                                                LayerNorm(d_model, layer_norm_eps, bias=bias))
        if custom_decoder is None:
            custom_decoder = TransformerDecoder(TransformerDecoderLayer(*options), num_decoder_layers,
                                                LayerNorm(d_model, layer_norm_eps, bias=bias))
        self.encoder, self.decoder = custom_encoder, custom_decoder
        for parameter in self.parameters():
            if parameter.ndim > 1:
                init.xavier_uniform_(parameter)
        self.d_model, self.nhead, self.batch_first = d_model, nhead, batch_first

    def forward(self, src, tgt, src_mask=None, tgt_mask=None, memory_mask=None, src_key_padding_mask=None,
                tgt_key_padding_mask=None, memory_key_padding_mask=None, src_is_causal=None,
                tgt_is_causal=None, memory_is_causal=False):
        batch_axis = 0 if self.batch_first else 1
        if src.ndim == 3 and src.shape[batch_axis] != tgt.shape[batch_axis]:
            raise ShapeError(f"Transformer: the batch sizes of src {src.shape} and tgt {tgt.shape} must be "
                             "equal")
        if src.shape[-1] != self.d_model or tgt.shape[-1] != self.d_model:
            raise ShapeError(f"Transformer: the feature sizes of src {src.shape} and tgt {tgt.shape} must "
                             f"equal d_model={self.d_model}")
        memory = self.encoder(src, mask=src_mask, src_key_padding_mask=src_key_padding_mask,
                              is_causal=src_is_causal)
        return self.decoder(tgt, memory, tgt_mask=tgt_mask, memory_mask=memory_mask,
                            tgt_key_padding_mask=tgt_key_padding_mask,
                            memory_key_padding_mask=memory_key_padding_mask, tgt_is_causal=tgt_is_causal,
                            memory_is_causal=memory_is_causal)

    @staticmethod
    def generate_square_subsequent_mask(sz, device=None, dtype=None):
        """A float (sz, sz) mask: -inf above the diagonal (future positions), 0 elsewhere."""
        return creation.full((sz, sz), float("-inf"), dtype=dtype).triu(1)
