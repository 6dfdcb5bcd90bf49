"""The chapter's module learns to reverse a sequence, through attn.torch and torch.optim.SGD.

The Python twin of tools/train_attention.c: random sequences of T tokens from a
vocabulary of 8 (tokens 1..7), a token and a position embedding, the chapter's
multi-head self-attention (E = 32, H = 2, no mask) computed by attn's kernels, and
an output layer; cross-entropy against the sequence reversed. To reverse, the
query at position t must find the key at position T-1-t, so a trained model's
attention puts its weight on the anti-diagonal, shared between the two heads; the
script prints both heads' weights for one sequence at the end.

    python train_reverse.py [--steps 600] [--lr 0.5] [--seq-len 6] [--seed 1]

It prints the loss and accuracy every tenth of the run, and exits with status 1
when the final loss is not below the first (so a test can run it briefly).
"""
import argparse
import sys

import torch
from torch import nn

import attn
import attn.torch as attention

V, E, H, BATCH = 8, 32, 2, 32


class Reverser(nn.Module):
    def __init__(self, seq_len):
        super().__init__()
        self.embed = nn.Embedding(V, E)
        self.pos = nn.Parameter(torch.randn(seq_len, E))
        self.attention = attention.MultiHeadSelfAttention(E, H)
        self.head = nn.Linear(E, V)

    def forward(self, ids, return_attention=False):
        x = self.embed(ids) + self.pos
        y, weights = self.attention(x, return_attention=True) if return_attention else (
            self.attention(x), None)
        logits = self.head(y)
        return (logits, weights) if return_attention else logits


def batch(gen, seq_len):
    ids = torch.randint(1, V, (BATCH, seq_len), generator=gen)
    return ids, ids.flip(1)


def evaluate(model, ids, target):
    logits = model(ids)
    loss = nn.functional.cross_entropy(logits.reshape(-1, V), target.reshape(-1))
    accuracy = (logits.argmax(-1) == target).float().mean()
    return loss, accuracy


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--lr", type=float, default=0.5)
    parser.add_argument("--seq-len", type=int, default=6)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    if args.steps < 1 or args.seq_len < 2 or not args.lr > 0:
        parser.error("--steps must be >= 1, --seq-len >= 2 and --lr > 0")

    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed + 1)
    model = Reverser(args.seq_len)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    print("attention on attn (%s kernels): reverse %d tokens, E=%d H=%d, SGD lr %g, batch %d"
          % (attn.arch()["selected"], args.seq_len, E, H, args.lr, BATCH))
    first = last = None
    every = max(1, args.steps // 10)
    for step in range(1, args.steps + 1):
        ids, target = batch(gen, args.seq_len)
        loss, accuracy = evaluate(model, ids, target)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if first is None:
            first = loss.item()
            print("step %5d  loss %.4f  accuracy %.3f" % (0, first, accuracy.item()))
        if step % every == 0 or step == args.steps:
            print("step %5d  loss %.4f  accuracy %.3f" % (step, loss.item(), accuracy.item()))
    with torch.no_grad():
        ids, target = batch(gen, args.seq_len)
        loss, accuracy = evaluate(model, ids, target)
        last = loss.item()
        _, weights = model(ids[:1], return_attention=True)
    print("final loss %.4f  accuracy %.3f on a new batch" % (last, accuracy.item()))
    print("attention weights for %s (rows: queries, columns: keys):" % ids[0].tolist())
    for t in range(args.seq_len):
        print("  " + "    ".join(" ".join("%4.2f" % w for w in weights[0, h, t].tolist())
                                for h in range(H)))
    return 0 if last < first else 1


if __name__ == "__main__":
    sys.exit(main())
