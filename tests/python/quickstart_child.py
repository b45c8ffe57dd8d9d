"""The README's three-line quick-start as a new user runs it: TinyLM (--vocab 32768 --dim
256: 0.22 GB of weights and AdamW state; --batch 1: about 0.5 s an iteration here), every cairn setting at its default (a save every
step, a drain every 10th), --steps iterations. Prints "skipped N of M" and, when it
restored something first, "restored S"; --stop-at K exits abruptly (os._exit, like a
kill) right after the save of step K."""

import argparse
import os
import sys

import torch

import cairn.torch
from tiny_lm import TinyLM, batch, loss_of


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--vocab", type=int, default=32768)
    p.add_argument("--dim", type=int, default=256)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--stop-at", type=int, default=0)
    a = p.parse_args()
    torch.manual_seed(0)
    model = TinyLM(vocab=a.vocab, dim=a.dim)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    ckpt = cairn.torch.Checkpointer(model, opt)
    start = ckpt.restore() or 0
    if start:
        print(f"restored {start}", flush=True)
    skipped = 0
    for step in range(start + 1, a.steps + 1):
        x, y = batch(step, 0, size=a.batch, vocab=a.vocab)
        loss = loss_of(model, x, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if not ckpt.save(step):
            skipped += 1
        if step == a.stop_at:
            print(f"skipped {skipped} of {step - start}", flush=True)
            os._exit(0)
    print(f"skipped {skipped} of {a.steps - start}", flush=True)
    ckpt.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
