#!/usr/bin/env python3
"""torch_bert.py - the BERT masked-language model of examples/bert in
PyTorch eager mode, to measure its training throughput against
examples/bert_train on the same GPU (doc/bert_train.md, "GPU").

The same model, operation for operation (examples/bert/model.c):
  - embeddings: word + position + token type, LayerNorm (eps 1e-12);
  - L post-LN blocks: x = LN(x + Dense(Attn(x))), x = LN(x + FFN(x)),
    attention as explicit matmuls: scores = Q K^T / sqrt(dh) per (batch,
    head), keys at positions >= the sequence's length set to -1e9,
    softmax, times V (no SDPA, no flash attention); FFN = Linear(H, F),
    GELU (erf form), Linear(F, H); no dropout;
  - the masked-LM head on the masked positions only (gathered first, as
    model.c does): Linear(H, H), GELU, LayerNorm, decoder tied to the word
    embeddings plus a bias; cross-entropy, mean over the masked positions;
  - initialisation normal(0, 0.02) for weights and embeddings, biases 0,
    LayerNorm weights 1; AdamW (betas 0.9/0.999, eps 1e-8, weight decay
    0.01 on every parameter, as bert_train), float32 throughout (TF32 off
    unless --tf32), no torch.compile.
Synthetic data made with torch: token ids uniform over the vocabulary's
words, lengths from 3/4 S to S, 15 % of the real tokens masked (80 % [MASK],
10 % a random word, 10 % kept), as bert_train masks. A pool of batches is
made on the host before timing; each step copies one to the device (ids,
types, lengths, masked rows and targets), as bert_train copies its batch.
Each step reads its loss back (.item()), as bert_train does.

Output: one JSON line on stdout, e.g.
  {"impl": "torch-eager", "preset": "mini", "batch": 8, "seq": 128,
   "vocab": 8192, "steps": 50, "warmup": 10, "tokens_per_s": 123456.7, ...}
tokens_per_s = batch x seq (padding included, as bert_train counts) x the
timed steps / their wall time, between two torch.cuda.synchronize().

  python3 examples/bert/torch_bert.py --preset mini --batch 8 --seq 128 \\
      --steps 50 --device cuda
"""
import argparse
import json
import math
import sys
import time

import torch
import torch.nn.functional as F

PRESETS = {  # L, H, A, F, V, P (examples/bert/model.c bert_config_preset)
    "tiny": (2, 64, 2, 256, 512, 128),
    "mini": (4, 256, 4, 1024, 8192, 512),
    "base": (12, 768, 12, 3072, 30522, 512),
}
NUM_SPECIAL, PAD_ID, MASK_ID = 5, 0, 4  # examples/bert/tokenizer.h
MASK_VALUE = -1e9  # BERT_MASK_VALUE
LN_EPS = 1e-12


class Layer(torch.nn.Module):
    def __init__(self, H, A, Fi):
        super().__init__()
        self.A = A
        self.query = torch.nn.Linear(H, H)
        self.key = torch.nn.Linear(H, H)
        self.value = torch.nn.Linear(H, H)
        self.attn_out = torch.nn.Linear(H, H)
        self.attn_ln = torch.nn.LayerNorm(H, eps=LN_EPS)
        self.inter = torch.nn.Linear(H, Fi)
        self.out = torch.nn.Linear(Fi, H)
        self.out_ln = torch.nn.LayerNorm(H, eps=LN_EPS)

    def forward(self, x, key_pad):  # x [B,S,H]; key_pad [B,1,1,S] bool
        B, S, H = x.shape
        dh = H // self.A

        def heads(t):  # [B,S,H] -> [B,A,S,dh]
            return t.view(B, S, self.A, dh).transpose(1, 2)

        q, k, v = heads(self.query(x)), heads(self.key(x)), heads(self.value(x))
        scores = torch.matmul(q, k.transpose(-1, -2)) * (1.0 / math.sqrt(dh))
        scores = scores.masked_fill(key_pad, MASK_VALUE)
        probs = torch.softmax(scores, dim=-1)
        ctx = torch.matmul(probs, v).transpose(1, 2).reshape(B, S, H)
        x = self.attn_ln(x + self.attn_out(ctx))
        return self.out_ln(x + self.out(F.gelu(self.inter(x))))


class Bert(torch.nn.Module):
    def __init__(self, L, H, A, Fi, V, P, T=2):
        super().__init__()
        self.word = torch.nn.Embedding(V, H)
        self.pos = torch.nn.Embedding(P, H)
        self.token_type = torch.nn.Embedding(T, H)
        self.emb_ln = torch.nn.LayerNorm(H, eps=LN_EPS)
        self.layers = torch.nn.ModuleList(Layer(H, A, Fi) for _ in range(L))
        self.transform = torch.nn.Linear(H, H)
        self.transform_ln = torch.nn.LayerNorm(H, eps=LN_EPS)
        self.decoder_bias = torch.nn.Parameter(torch.zeros(V))
        for name, p in self.named_parameters():
            if name.endswith("ln.weight"):
                torch.nn.init.ones_(p)
            elif name.endswith("bias"):
                torch.nn.init.zeros_(p)
            else:
                torch.nn.init.normal_(p, 0.0, 0.02)

    def forward(self, ids, types, lengths, rows, targets):
        B, S = ids.shape
        positions = torch.arange(S, device=ids.device)
        x = self.word(ids) + self.pos(positions)[None] + self.token_type(types)
        x = self.emb_ln(x)
        key_pad = (positions[None, :] >= lengths[:, None])[:, None, None, :]
        for layer in self.layers:
            x = layer(x, key_pad)
        h = x.reshape(B * S, -1).index_select(0, rows)  # the masked rows
        t = self.transform_ln(F.gelu(self.transform(h)))
        logits = F.linear(t, self.word.weight, self.decoder_bias)  # tied
        return F.cross_entropy(logits, targets)


def make_batch(gen, B, S, V):
    """A masked batch on the host: ids, types, lengths, rows, targets."""
    lengths = torch.randint(S - S // 4, S + 1, (B,), generator=gen)
    ids = torch.randint(NUM_SPECIAL, V, (B, S), generator=gen)
    real = torch.arange(S)[None, :] < lengths[:, None]
    ids = torch.where(real, ids, torch.full_like(ids, PAD_ID))
    chosen = real & (torch.rand(B, S, generator=gen) < 0.15)
    chosen[:, 0] |= ~chosen.any(dim=1)  # at least one per sequence
    targets = ids[chosen]
    rows = chosen.reshape(-1).nonzero().squeeze(1)
    u = torch.rand(B, S, generator=gen)
    rand_words = torch.randint(NUM_SPECIAL, V, (B, S), generator=gen)
    ids = torch.where(chosen & (u < 0.8), torch.full_like(ids, MASK_ID), ids)
    ids = torch.where(chosen & (u >= 0.8) & (u < 0.9), rand_words, ids)
    types = torch.zeros_like(ids)
    return ids, types, lengths, rows, targets


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", choices=sorted(PRESETS), default="mini")
    ap.add_argument("--batch", type=int, default=8, help="sequences per step")
    ap.add_argument("--seq", type=int, default=128, help="tokens per sequence")
    ap.add_argument("--vocab", type=int, default=0,
                    help="vocabulary size (default: the preset's; use the V "
                    "bert_train printed to compare with its run)")
    ap.add_argument("--steps", type=int, default=50, help="timed steps")
    ap.add_argument("--warmup", type=int, default=10,
                    help="untimed steps first (allocator, cuBLAS heuristics)")
    ap.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--tf32", action="store_true",
                    help="TF32 tensor cores for float32 matmuls (default off)")
    ap.add_argument("--pool", type=int, default=16,
                    help="distinct batches made before timing")
    a = ap.parse_args()

    L, H, A, Fi, V, P = PRESETS[a.preset]
    if a.vocab > 0:
        V = a.vocab
    if a.seq > P:
        P = a.seq
    dev = torch.device(a.device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        sys.exit("torch_bert.py: --device cuda, but torch sees no CUDA device")
    # torch >= 2.9: fp32_precision; allow_tf32 warns there, and a mix of
    # the legacy and the new flags can raise RuntimeError when read. cuDNN
    # is not used (no convolutions): only the matmuls are set.
    if hasattr(torch.backends.cuda.matmul, "fp32_precision"):
        torch.backends.cuda.matmul.fp32_precision = "tf32" if a.tf32 else "ieee"
    else:
        torch.backends.cuda.matmul.allow_tf32 = a.tf32
    torch.manual_seed(a.seed)

    model = Bert(L, H, A, Fi, V, P).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, betas=(0.9, 0.999),
                            eps=1e-8, weight_decay=0.01)
    gen = torch.Generator().manual_seed(a.seed)
    pin = dev.type == "cuda"
    pool = []
    for _ in range(a.pool):
        b = make_batch(gen, a.batch, a.seq, V)
        pool.append(tuple(t.pin_memory() if pin else t for t in b))

    def step(i):
        batch = [t.to(dev, non_blocking=True) for t in pool[i % len(pool)]]
        opt.zero_grad()  # set_to_none, the default: the faster baseline
        loss = model(*batch)
        loss.backward()
        opt.step()
        return loss.item()  # one read back per step, as bert_train

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    first_loss = step(0)
    for i in range(1, a.warmup):
        step(i)
    sync()
    t0 = time.perf_counter()
    loss = first_loss
    for i in range(a.steps):
        loss = step(a.warmup + i)
    sync()
    seconds = time.perf_counter() - t0
    tokens = a.batch * a.seq * a.steps
    nparams = sum(p.numel() for p in model.parameters())
    print(json.dumps({
        "impl": "torch-eager", "preset": a.preset, "layers": L, "hidden": H,
        "heads": A, "ffn": Fi, "vocab": V, "batch": a.batch, "seq": a.seq,
        "steps": a.steps, "warmup": a.warmup, "device": str(dev),
        "gpu": torch.cuda.get_device_name(dev) if dev.type == "cuda" else None,
        "tf32": a.tf32, "torch": torch.__version__, "weights": nparams,
        "first_loss": round(first_loss, 6), "last_loss": round(loss, 6),
        "step_ms": round(1e3 * seconds / max(a.steps, 1), 4),
        "tokens_per_s": round(tokens / seconds, 1)}))


if __name__ == "__main__":
    main()
