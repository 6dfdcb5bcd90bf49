"""The chapter's experiment, written against the chapter's module: only the import
line says it runs on attn. Same flags and defaults, the same seven lines.

    python inspect_self_attention.py [--batch-size 2] [--seq-len 5] [--embed-dim 16]
                                     [--num-heads 4] [--seed 42]

The tests run this file as it is and again with the import line swapped for the
plain-PyTorch module, and compare what the two print and compute.
"""
import argparse

import torch

import attn.torch as attention


def demo_token_ids(batch_size, seq_len):
    """Sample b holds seq_len - 1 - (b mod min(seq_len, 3)) real tokens (at least one),
    numbered from b * seq_len + 1, then pad tokens 0 - the chapter's demo ids."""
    if batch_size < 1 or seq_len < 1:
        raise ValueError("batch_size and seq_len must be >= 1, not %d and %d"
                         % (batch_size, seq_len))
    ids = torch.zeros(batch_size, seq_len, dtype=torch.long)
    for b in range(batch_size):
        real = max(1, seq_len - 1 - b % max(1, min(seq_len, 3)))
        ids[b, :real] = b * seq_len + torch.arange(1, real + 1)
    return ids


def main(argv=None):
    parser = argparse.ArgumentParser(description="chapter 11: the shapes and masks of "
                                     "self-attention")
    for flag, default in (("--batch-size", 2), ("--seq-len", 5), ("--embed-dim", 16),
                          ("--num-heads", 4), ("--seed", 42)):
        parser.add_argument(flag, type=int, default=default)
    args = parser.parse_args(argv)

    torch.manual_seed(args.seed)
    x = torch.randn(args.batch_size, args.seq_len, args.embed_dim)
    ids = demo_token_ids(args.batch_size, args.seq_len)
    module = attention.MultiHeadSelfAttention(embed_dim=args.embed_dim,
                                              num_heads=args.num_heads)
    mask = (attention.make_padding_attention_mask(ids, pad_id=0)
            & attention.make_causal_attention_mask(args.seq_len, device=x.device))
    output, weights = module(x, attention_mask=mask, return_attention=True)
    last_real = int((ids[0] != 0).sum()) - 1

    print("x_shape=%s" % (tuple(x.shape),))
    print("token_ids=%s" % ids.tolist())
    print("output_shape=%s" % (tuple(output.shape),))
    print("attention_shape=%s" % (tuple(weights.shape),))
    print("combined_mask_shape=%s" % (tuple(mask.shape),))
    print("first_head_weights_row0=%s" % [round(w, 4) for w in weights[0, 0, 0].tolist()])
    print("last_real_query_can_attend_to=%s" % mask[0, 0, last_real].int().tolist())
    return output, weights


if __name__ == "__main__":
    main()
