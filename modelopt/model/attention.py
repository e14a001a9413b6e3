"""Attention with its projections as `nn.Linear` layers, so every weight of a transformer is a layer modelopt
compresses like any other.

`nn.MultiheadAttention` keeps its query, key and value projections in one raw parameter (`in_proj_weight`), not
in a Linear module: nothing could quantize or prune it. `unfuse_attention` replaces each (in place, after its
weights are loaded) by `SelfAttention`, which computes the same thing with `in_proj` (an `nn.Linear` of
3 x width rows: queries, keys, values) and the original `out_proj`.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

__all__ = ["SelfAttention", "unfuse_attention"]


class SelfAttention(nn.Module):
    """`nn.MultiheadAttention`'s computation (no bias_k/bias_v, no zero attention, equal key/value widths) with
    the input projection as `in_proj`, an `nn.Linear`: a drop-in for calls like ``attn(x, x, x, need_weights=False)``.
    """

    def __init__(self, mha: nn.MultiheadAttention) -> None:
        super().__init__()
        d = mha.embed_dim
        if mha.bias_k is not None or mha.add_zero_attn or not mha._qkv_same_embed_dim:
            raise ValueError("only attention with one input projection, no bias_k/bias_v and no zero attention "
                             "is unfused")
        self.embed_dim, self.num_heads, self.dropout, self.batch_first = d, mha.num_heads, mha.dropout, mha.batch_first
        self.in_proj = nn.Linear(d, 3 * d, bias=mha.in_proj_bias is not None,
                                 device=mha.in_proj_weight.device, dtype=mha.in_proj_weight.dtype)
        with torch.no_grad():
            self.in_proj.weight.copy_(mha.in_proj_weight)
            if mha.in_proj_bias is not None:
                self.in_proj.bias.copy_(mha.in_proj_bias)
        self.out_proj = mha.out_proj
        self.train(mha.training)

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                key_padding_mask: torch.Tensor | None = None, need_weights: bool = True,
                attn_mask: torch.Tensor | None = None, average_attn_weights: bool = True,
                is_causal: bool = False) -> tuple[torch.Tensor, None]:
        if not self.batch_first:
            query, key, value = (t.transpose(0, 1) for t in (query, key, value))
        d, h = self.embed_dim, self.num_heads
        if query is key and key is value:
            q, k, v = self.in_proj(query).chunk(3, dim=-1)
        else:
            w, b = self.in_proj.weight, self.in_proj.bias
            q, k, v = (F.linear(t, w[i * d:(i + 1) * d], None if b is None else b[i * d:(i + 1) * d])
                       for i, t in enumerate((query, key, value)))
        n, length = q.shape[0], q.shape[1]
        q, k, v = (t.reshape(n, t.shape[1], h, d // h).transpose(1, 2) for t in (q, k, v))
        mask = _mask(attn_mask, key_padding_mask, n, h, q.dtype)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=self.dropout if self.training else 0.0,
                                             is_causal=is_causal and mask is None)
        out = self.out_proj(out.transpose(1, 2).reshape(n, length, d))
        return (out if self.batch_first else out.transpose(0, 1)), None


def _mask(attn_mask: torch.Tensor | None, key_padding_mask: torch.Tensor | None, n: int, h: int,
          dtype: torch.dtype) -> torch.Tensor | None:
    """One additive (or boolean keep) mask for scaled_dot_product_attention from MultiheadAttention's two."""
    if attn_mask is None and key_padding_mask is None:
        return None
    masks = []
    if attn_mask is not None:
        masks.append(_additive(attn_mask, dtype).reshape(-1, h, *attn_mask.shape[-2:]) if attn_mask.dim() == 3
                     else _additive(attn_mask, dtype))
    if key_padding_mask is not None:
        masks.append(_additive(key_padding_mask, dtype)[:, None, None, :])
    out = masks[0]
    for m in masks[1:]:
        out = out + m
    return out


def _additive(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """MultiheadAttention's masks: True (or nonzero float) where attention is not allowed / added as is."""
    if mask.dtype == torch.bool:
        return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(mask, float("-inf"))
    return mask.to(dtype)


def unfuse_attention(model: nn.Module) -> nn.Module:
    """`model` with every `nn.MultiheadAttention` replaced, in place, by the equivalent `SelfAttention` (the
    model itself returned, or its replacement when it is one)."""
    if isinstance(model, nn.MultiheadAttention):
        return SelfAttention(model)
    for name, child in list(model.named_children()):
        if isinstance(child, nn.MultiheadAttention):
            setattr(model, name, SelfAttention(child))
        else:
            unfuse_attention(child)
    return model
