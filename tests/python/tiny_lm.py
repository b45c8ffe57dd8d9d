"""A small transformer language model on synthetic tokens, shared by the PyTorch tests and
bench/torch_compare.py. Batches are a function of (step, rank), so any run can be replayed."""

import torch
import torch.nn as nn
import torch.nn.functional as F


class TinyLM(nn.Module):
    def __init__(self, vocab=256, dim=64, layers=2, heads=4, seq=32, dropout=0.1):
        super().__init__()
        self.seq = seq
        self.vocab = vocab
        self.embed = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.randn(seq, dim) * 0.02)
        layer = nn.TransformerEncoderLayer(
            dim, heads, 4 * dim, dropout=dropout, batch_first=True, norm_first=True
        )
        self.blocks = nn.TransformerEncoder(layer, layers)
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        # A buffer the forward pass updates (like BatchNorm's running statistics).
        self.register_buffer("tokens_seen", torch.zeros((), dtype=torch.int64))
        mask = torch.triu(torch.full((seq, seq), float("-inf")), diagonal=1)
        self.register_buffer("causal", mask, persistent=False)

    def forward(self, x):
        self.tokens_seen += x.numel()
        h = self.embed(x) + self.pos[: x.shape[1]]
        h = self.blocks(h, mask=self.causal[: x.shape[1], : x.shape[1]])
        return self.head(self.norm(h))


def batch(step, rank=0, size=8, seq=32, vocab=256):
    """Synthetic tokens with structure to learn (each next token depends on the last)."""
    g = torch.Generator().manual_seed(1000003 * step + rank)
    start = torch.randint(0, vocab, (size, 1), generator=g)
    stride = torch.randint(1, 7, (size, 1), generator=g)
    idx = (start + stride * torch.arange(seq + 1)) % vocab
    noise = torch.randint(0, vocab, idx.shape, generator=g)
    keep = torch.rand(idx.shape, generator=g) < 0.9
    idx = torch.where(keep, idx, noise)
    return idx[:, :-1], idx[:, 1:]


def loss_of(model, x, y):
    logits = model(x)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


class TPLM(nn.Module):
    """A language model built for tensor parallelism (parallelize_tp): token embedding and
    output head split over the vocabulary, MLP blocks split Colwise/Rowwise; layer norms
    and the position table replicated. Same sizes as TinyLM's embedding and head."""

    def __init__(self, vocab=256, dim=64, layers=2, seq=32):
        super().__init__()
        self.vocab = vocab
        self.embed = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.randn(seq, dim) * 0.02)
        self.norms = nn.ModuleList(nn.LayerNorm(dim) for _ in range(layers))
        self.ups = nn.ModuleList(nn.Linear(dim, 4 * dim) for _ in range(layers))
        self.downs = nn.ModuleList(nn.Linear(4 * dim, dim) for _ in range(layers))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)

    def forward(self, x):
        h = self.embed(x) + self.pos[: x.shape[1]]
        for norm, up, down in zip(self.norms, self.ups, self.downs):
            h = h + down(F.gelu(up(norm(h))))
        return self.head(self.norm(h))


def parallelize_tp(model, mesh):
    """Splits a TPLM over the 1-D device mesh `mesh` (PyTorch 2.x tensor parallelism)."""
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    plan = {"embed": RowwiseParallel(input_layouts=Replicate()),
            "head": ColwiseParallel(output_layouts=Replicate())}
    for i in range(len(model.ups)):
        plan[f"ups.{i}"] = ColwiseParallel()
        plan[f"downs.{i}"] = RowwiseParallel()
    return parallelize_module(model, mesh, plan)
