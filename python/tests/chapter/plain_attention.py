"""The chapter's module written again in plain PyTorch, for the tests to compare with.

Written for these tests from SPEC section 1 (the chapter's semantics): the same
four names and signatures as the chapter's module, every step a PyTorch operation,
so autograd gives the gradients attn.torch must match. It is the oracle here, not
a copy of the chapter's code.
"""
import math

import torch
from torch import nn


def scaled_dot_product_attention(query, key, value, attention_mask=None):
    if query.shape[-1] != key.shape[-1]:
        raise ValueError("query and key must have the same head_dim")
    if key.shape[-2] != value.shape[-2]:
        raise ValueError("key and value must have the same sequence length")
    scores = torch.matmul(query, key.transpose(-2, -1)) / math.sqrt(query.shape[-1])
    if attention_mask is not None:
        if attention_mask.dtype != torch.bool:
            raise ValueError("attention_mask must be boolean")
        try:
            visible = attention_mask.expand(scores.shape)
        except RuntimeError:
            raise ValueError("attention_mask shape %s cannot broadcast to %s"
                             % (tuple(attention_mask.shape), tuple(scores.shape))) from None
        if not bool(visible.any(dim=-1).all()):
            raise ValueError("each query must see at least one key")
        scores = torch.where(visible, scores, torch.full_like(scores, -math.inf))
    weights = torch.softmax(scores, dim=-1)
    return torch.matmul(weights, value), weights


def make_padding_attention_mask(token_ids, pad_id):
    return (token_ids != pad_id)[:, None, None, :]


def make_causal_attention_mask(seq_len, device=None):
    rows = torch.arange(seq_len, device=device)
    return (rows[None, :] <= rows[:, None])[None, None]


class MultiHeadSelfAttention(nn.Module):
    def __init__(self, embed_dim, num_heads):
        super().__init__()
        if embed_dim % num_heads:
            raise ValueError("embed_dim must be divisible by num_heads")
        self.embed_dim, self.num_heads = embed_dim, num_heads
        self.head_dim = embed_dim // num_heads
        self.qkv = nn.Linear(embed_dim, 3 * embed_dim)
        self.output = nn.Linear(embed_dim, embed_dim)

    def forward(self, x, attention_mask=None, return_attention=False):
        B, T, E = x.shape
        heads = [t.reshape(B, T, self.num_heads, self.head_dim).permute(0, 2, 1, 3)
                 for t in torch.split(self.qkv(x), E, dim=-1)]
        context, weights = scaled_dot_product_attention(*heads, attention_mask=attention_mask)
        out = self.output(context.permute(0, 2, 1, 3).reshape(B, T, E))
        return (out, weights) if return_attention else out
