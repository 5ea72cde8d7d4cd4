#!/usr/bin/env python3
"""torch_bert.py - the BERT masked-language model of examples/bert in
PyTorch, to measure its training throughput against examples/bert_train
on the same GPU (doc/bert_train.md, "GPU"): by default in eager mode and
float32, as bert_train; with --best as a user on an H100 would run it.

The same model, operation for operation (examples/bert/model.c):
  - embeddings: word + position + token type, LayerNorm (eps 1e-12);
  - L post-LN blocks: x = LN(x + Dense(Attn(x))), x = LN(x + FFN(x)),
    attention as explicit matmuls: scores = Q K^T / sqrt(dh) per (batch,
    head), keys at positions >= the sequence's length set to -1e9,
    softmax, times V (by default no SDPA, no flash attention); FFN =
    Linear(H, F), GELU (erf form), Linear(F, H); no dropout;
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

Options that change how PyTorch runs the same model (none by default):
  --precision bf16|fp16  PyTorch AMP: the forward and the loss under
      torch.autocast(dtype) (matmuls in bf16/fp16, softmax, LayerNorm and
      the cross-entropy in float32, as autocast chooses), parameters,
      gradients and AdamW in float32; fp16 scales the loss with a
      GradScaler (scale, step, update), bf16 needs none; the explicit
      attention's -1e9 is float16's lowest, -65504, under fp16. Refused
      (exit 2) where this torch has no such autocast or GradScaler for the
      device.
  --sdpa  attention through F.scaled_dot_product_attention with a boolean
      mask excluding the same keys (flash, memory-efficient or cuDNN
      kernels as torch picks); in float32 its losses are the explicit
      path's to about 1e-6.
  --compile  torch.compile(model): forward and loss compiled (Inductor),
      the backward through AOTAutograd; the masked rows' count is marked
      dynamic, so one compilation serves every batch. The compilation
      happens in the warmup steps, which are not timed; the JSON gives
      compile_s (the warmup's wall time less what its steps take once
      compiled) and timed_recompiles (graphs compiled in the timed steps:
      should be 0; a warning on stderr otherwise).
  --fused-adamw  AdamW(fused=True) where this torch has it for the device
      (CUDA; CPU since torch 2.4), else AdamW(foreach=True).
  --best  --precision bf16 --sdpa --compile --fused-adamw: what a user on
      an H100 runs, and the reference hvd is measured against on a GPU
      (bench/gpu-session.sh's bert stage runs it beside the default); a
      --precision given as well replaces its bf16.
  --hf  Hugging Face transformers' BertForMaskedLM instead of the model
      above, configured as the preset (the same sizes, vocabulary and
      positions, GELU erf, LayerNorm eps 1e-12, no dropout, the decoder
      tied), trained as its users train it: attention_mask for the
      padding, labels -100 except at the masked positions (made on the
      host with the batch, as a data collator makes them). Its head
      therefore runs on every position (logits for all B*S tokens, where
      model.c and the model above take the masked rows only), and its
      masked keys get the dtype's lowest value rather than -1e9: the same
      loss, more work. With --sdpa attn_implementation "sdpa", else
      "eager"; the other options as above. Refused (exit 2) without
      transformers.
  --clip-grad-norm X  torch.nn.utils.clip_grad_norm_(params, X) between
      backward and step (after GradScaler.unscale_ in fp16), as bert_train
      --clip-grad-norm X; --no-decay A,B  AdamW's second parameter group,
      weight decay 0, for the parameters whose names hold A or B (matched
      as bert_train's: "emb_ln.weight" is "embeddings.LayerNorm.weight"),
      as bert_train --no-decay A,B. BERT's recipe is both: --clip-grad-norm
      1 --no-decay bias,LayerNorm.weight. The JSON gives clip_grad_norm and
      no_decay_params (the exempt parameters' count).

Output: one JSON line on stdout, e.g.
  {"impl": "torch-eager", "preset": "mini", "batch": 8, "seq": 128,
   "vocab": 8192, "steps": 50, "warmup": 10, "tokens_per_s": 123456.7, ...,
   "precision": "fp32", "sdpa": false, "compile": false,
   "fused_adamw": false, "adamw": "default", "compile_s": null, ...}
impl is torch|hf[-amp-PRECISION][-sdpa]-eager|compile ("torch-eager" by
default, "torch-amp-bf16-sdpa-compile" with --best, "hf-..." with --hf);
adamw is the AdamW that ran (default, fused or foreach). tokens_per_s = batch x seq (padding
included, as bert_train counts) x the timed steps / their wall time,
between two torch.cuda.synchronize(). --print-loss writes each step's loss
on stderr.

  python3 examples/bert/torch_bert.py --preset mini --batch 8 --seq 128 \\
      --steps 50 --device cuda
  python3 examples/bert/torch_bert.py --preset mini --batch 8 --seq 128 \\
      --steps 50 --device cuda --best
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
    def __init__(self, H, A, Fi, sdpa=False):
        super().__init__()
        self.A = A
        self.sdpa = sdpa
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
        if self.sdpa:
            # the same keys excluded: a boolean mask is True where a key
            # takes part; its -inf and the explicit path's -1e9 both give
            # those keys a weight of 0 (no sequence is all padding)
            ctx = F.scaled_dot_product_attention(q, k, v, attn_mask=~key_pad)
        else:
            scores = torch.matmul(q, k.transpose(-1, -2)) * (1.0 / math.sqrt(dh))
            # -1e9 in float32 and bfloat16; float16 (autocast) cannot
            # hold it: its lowest, -65504, then (a weight of 0 all the same)
            fill = max(MASK_VALUE, torch.finfo(scores.dtype).min)
            scores = scores.masked_fill(key_pad, fill)
            probs = torch.softmax(scores, dim=-1)
            ctx = torch.matmul(probs, v)
        ctx = ctx.transpose(1, 2).reshape(B, S, H)
        x = self.attn_ln(x + self.attn_out(ctx))
        return self.out_ln(x + self.out(F.gelu(self.inter(x))))


class Bert(torch.nn.Module):
    def __init__(self, L, H, A, Fi, V, P, T=2, sdpa=False):
        super().__init__()
        self.word = torch.nn.Embedding(V, H)
        self.pos = torch.nn.Embedding(P, H)
        self.token_type = torch.nn.Embedding(T, H)
        self.emb_ln = torch.nn.LayerNorm(H, eps=LN_EPS)
        self.layers = torch.nn.ModuleList(Layer(H, A, Fi, sdpa)
                                          for _ in range(L))
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


class HfBert(torch.nn.Module):
    """transformers' BertForMaskedLM as the preset (--hf); forward takes
    the batch as its users give it and returns the loss."""

    def __init__(self, L, H, A, Fi, V, P, sdpa):
        super().__init__()
        import transformers
        impl = "sdpa" if sdpa else "eager"
        cfg = transformers.BertConfig(
            vocab_size=V, hidden_size=H, num_hidden_layers=L,
            num_attention_heads=A, intermediate_size=Fi,
            max_position_embeddings=P, type_vocab_size=2, hidden_act="gelu",
            hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
            layer_norm_eps=LN_EPS, initializer_range=0.02,
            pad_token_id=PAD_ID, tie_word_embeddings=True)
        cfg._attn_implementation = impl
        try:  # transformers >= 4.36: the implementation chosen at init
            self.m = transformers.BertForMaskedLM._from_config(
                cfg, attn_implementation=impl)
        except TypeError:
            self.m = transformers.BertForMaskedLM(cfg)

    def forward(self, ids, types, attention_mask, labels):
        return self.m(input_ids=ids, token_type_ids=types,
                      attention_mask=attention_mask, labels=labels).loss


def hf_batch(ids, types, lengths, rows, targets):
    """The batch as a BertForMaskedLM user gives it: ids, types, the
    attention mask (1 on real tokens) and labels (-100 but at the masked
    positions)."""
    B, S = ids.shape
    mask = (torch.arange(S)[None, :] < lengths[:, None]).long()
    labels = torch.full((B * S,), -100, dtype=torch.long)
    labels[rows] = targets
    return ids, types, mask, labels.view(B, S)


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


DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def impl_name(a):
    """torch|hf[-amp-P][-sdpa]-eager|compile: "torch-eager" by default."""
    parts = ["hf" if a.hf else "torch"]
    if a.precision != "fp32":
        parts += ["amp", a.precision]
    if a.sdpa:
        parts.append("sdpa")
    parts.append("compile" if a.compile else "eager")
    return "-".join(parts)


def autocast_works(dev, dtype):
    """Whether torch.autocast on dev computes a matmul in dtype (older
    torch only warns and disables itself for a dtype it lacks)."""
    try:
        x = torch.ones(4, 4, device=dev)
        with torch.autocast(device_type=dev.type, dtype=dtype):
            return torch.matmul(x, x).dtype == dtype
    except (AttributeError, RuntimeError, TypeError, ValueError):
        return False


def grad_scaler(dev):
    """torch.amp.GradScaler for dev, or torch.cuda.amp's on older torch;
    None when this torch has none for the device."""
    try:
        return torch.amp.GradScaler(dev.type)
    except (AttributeError, TypeError, RuntimeError):
        pass
    if dev.type == "cuda":
        return torch.cuda.amp.GradScaler()
    return None


def decay_groups(model, no_decay):
    """AdamW's parameter groups: every parameter, or with no_decay (a
    comma-separated list of name parts, bert_train --no-decay) a second
    group of those whose names hold one, weight decay 0 (HF's recipe).
    Names are matched as bert_train's: this model's "emb_ln.weight" is
    its "embeddings.LayerNorm.weight". Returns (groups, exempt count)."""
    parts = [x for x in no_decay.split(",") if x]
    named = [(n.replace("ln.", "LayerNorm."), p)
             for n, p in model.named_parameters()]
    if not parts:
        return [p for _, p in named], 0
    exempt = [p for n, p in named if any(x in n for x in parts)]
    rest = [p for n, p in named if not any(x in n for x in parts)]
    return [{"params": rest}, {"params": exempt, "weight_decay": 0.0}], \
        len(exempt)


def adamw(params, lr, fused):
    """AdamW as bert_train (params: parameters or groups); with fused,
    fused=True where this torch has it for the device (CUDA; CPU too since
    torch 2.4), else foreach=True.
    Returns (optimizer, "default" | "fused" | "foreach")."""
    kw = dict(lr=lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
    params = list(params)
    if not fused:
        return torch.optim.AdamW(params, **kw), "default"
    try:
        return torch.optim.AdamW(params, fused=True, **kw), "fused"
    except (RuntimeError, TypeError, ValueError):
        return torch.optim.AdamW(params, foreach=True, **kw), "foreach"


def compiled_graphs():
    """Graphs torch.compile has made so far (dynamo's private counter),
    or None where this torch does not keep it."""
    try:
        from torch._dynamo.utils import counters
        return int(counters["stats"]["unique_graphs"])
    except Exception:  # noqa: BLE001 - a private API, only for a check
        return None


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
                    help="untimed steps first (allocator, cuBLAS heuristics, "
                    "torch.compile's compilation)")
    ap.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--tf32", action="store_true",
                    help="TF32 tensor cores for float32 matmuls (default off)")
    ap.add_argument("--pool", type=int, default=16,
                    help="distinct batches made before timing")
    ap.add_argument("--precision", choices=sorted(DTYPES), default="fp32",
                    help="fp32 (default): float32 throughout; bf16, fp16: "
                    "the forward and the loss under torch.autocast, float32 "
                    "parameters and AdamW; fp16 with a GradScaler")
    ap.add_argument("--sdpa", action="store_true",
                    help="attention through F.scaled_dot_product_attention "
                    "(default: explicit matmuls and softmax)")
    ap.add_argument("--compile", action="store_true",
                    help="torch.compile the model (forward and loss); the "
                    "warmup steps absorb the compilation")
    ap.add_argument("--fused-adamw", action="store_true",
                    help="AdamW(fused=True) where supported, else foreach")
    ap.add_argument("--best", action="store_true",
                    help="--precision bf16 --sdpa --compile --fused-adamw: "
                    "what a user on an H100 runs (the reference on a GPU)")
    ap.add_argument("--hf", action="store_true",
                    help="transformers' BertForMaskedLM as the preset, its "
                    "head on every position (a second reference)")
    ap.add_argument("--print-loss", action="store_true",
                    help="each step's loss on stderr (step N loss X)")
    ap.add_argument("--clip-grad-norm", type=float, default=0.0,
                    help="clip_grad_norm_ to this norm before each step "
                    "(after the GradScaler's unscale_; bert_train "
                    "--clip-grad-norm; 0: off)")
    ap.add_argument("--no-decay", default="",
                    help="comma-separated name parts: weight decay 0 for "
                    "those parameters (bert_train --no-decay; BERT's "
                    "recipe: bias,LayerNorm.weight)")
    a = ap.parse_args()
    if a.best:
        if a.precision == "fp32":
            a.precision = "bf16"
        a.sdpa = a.compile = a.fused_adamw = True

    L, H, A, Fi, V, P = PRESETS[a.preset]
    if a.vocab > 0:
        V = a.vocab
    if a.seq > P:
        P = a.seq
    dev = torch.device(a.device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        sys.exit("torch_bert.py: --device cuda, but torch sees no CUDA device")
    amp_dtype = DTYPES[a.precision] if a.precision != "fp32" else None
    if amp_dtype is not None and not autocast_works(dev, amp_dtype):
        ap.error(f"--precision {a.precision}: torch {torch.__version__} has "
                 f"no {a.precision} autocast on {dev.type}")
    scaler = None
    if a.precision == "fp16":
        scaler = grad_scaler(dev)
        if scaler is None:
            ap.error(f"--precision fp16: torch {torch.__version__} has no "
                     f"GradScaler for {dev.type}; use --precision bf16")
    if a.hf:
        try:
            import transformers  # noqa: F401 - only whether it is there
        except ImportError as e:
            ap.error(f"--hf: no transformers for this python ({e})")
    if a.compile and not hasattr(torch, "compile"):
        ap.error(f"--compile: torch {torch.__version__} has no torch.compile "
                 "(2.0 or later)")
    # torch >= 2.9: fp32_precision; allow_tf32 warns there, and a mix of
    # the legacy and the new flags can raise RuntimeError when read. cuDNN
    # is not used (no convolutions): only the matmuls are set.
    if hasattr(torch.backends.cuda.matmul, "fp32_precision"):
        torch.backends.cuda.matmul.fp32_precision = "tf32" if a.tf32 else "ieee"
    else:
        torch.backends.cuda.matmul.allow_tf32 = a.tf32
    torch.manual_seed(a.seed)

    if a.hf:
        model = HfBert(L, H, A, Fi, V, P, a.sdpa).to(dev)
    else:
        model = Bert(L, H, A, Fi, V, P, sdpa=a.sdpa).to(dev)
    groups, exempt = decay_groups(model, a.no_decay)
    opt, adamw_impl = adamw(groups, a.lr, a.fused_adamw)
    # the masked rows' count changes from batch to batch: marked dynamic
    # so that the first compilation covers them all (else torch.compile
    # compiles again for the second batch)
    # (--hf: labels [B, S], nothing changes size)
    mark_dynamic = getattr(torch._dynamo, "maybe_mark_dynamic", None) \
        if a.compile and not a.hf else None
    forward = torch.compile(model) if a.compile else model
    gen = torch.Generator().manual_seed(a.seed)
    pin = dev.type == "cuda"
    pool = []
    for _ in range(a.pool):
        b = make_batch(gen, a.batch, a.seq, V)
        if a.hf:
            b = hf_batch(*b)
        pool.append(tuple(t.pin_memory() if pin else t for t in b))

    ran = [0]  # steps run so far, for --print-loss

    def step(i):
        batch = [t.to(dev, non_blocking=True) for t in pool[i % len(pool)]]
        if mark_dynamic is not None:
            mark_dynamic(batch[3], 0)  # rows
            mark_dynamic(batch[4], 0)  # targets
        opt.zero_grad()  # set_to_none, the default: the faster baseline
        if amp_dtype is None:
            loss = forward(*batch)
        else:
            with torch.autocast(device_type=dev.type, dtype=amp_dtype):
                loss = forward(*batch)
        if scaler is None:
            loss.backward()
            if a.clip_grad_norm > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(),
                                               a.clip_grad_norm)
            opt.step()
        else:
            scaler.scale(loss).backward()
            if a.clip_grad_norm > 0:
                scaler.unscale_(opt)
                torch.nn.utils.clip_grad_norm_(model.parameters(),
                                               a.clip_grad_norm)
            scaler.step(opt)
            scaler.update()
        value = loss.item()  # one read back per step, as bert_train
        if a.print_loss:
            print(f"step {ran[0]} loss {value:.9g}", file=sys.stderr)
        ran[0] += 1
        return value

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    t_warm = time.perf_counter()
    first_loss = step(0)
    for i in range(1, a.warmup):
        step(i)
    sync()
    warmup_s = time.perf_counter() - t_warm
    graphs = compiled_graphs() if a.compile else None
    t0 = time.perf_counter()
    loss = first_loss
    for i in range(a.steps):
        loss = step(a.warmup + i)
    sync()
    seconds = time.perf_counter() - t0
    recompiles = None
    if graphs is not None:
        recompiles = compiled_graphs() - graphs
        if recompiles:
            print(f"torch_bert.py: warning: torch.compile compiled {recompiles}"
                  " graph(s) during the timed steps: tokens_per_s includes "
                  "them; give more --warmup", file=sys.stderr)
    # the compilation: the warmup's wall time less what its steps take once
    # compiled (the timed steps' mean); step 0 runs even with --warmup 0
    compile_s = None
    if a.compile:
        compile_s = max(0.0, warmup_s - max(a.warmup, 1) * seconds
                        / max(a.steps, 1))
    tokens = a.batch * a.seq * a.steps
    nparams = sum(p.numel() for p in model.parameters())
    print(json.dumps({
        "impl": impl_name(a), "preset": a.preset, "layers": L, "hidden": H,
        "heads": A, "ffn": Fi, "vocab": V, "batch": a.batch, "seq": a.seq,
        "steps": a.steps, "warmup": a.warmup, "device": str(dev),
        "gpu": torch.cuda.get_device_name(dev) if dev.type == "cuda" else None,
        "tf32": a.tf32, "torch": torch.__version__, "weights": nparams,
        "first_loss": round(first_loss, 6), "last_loss": round(loss, 6),
        "step_ms": round(1e3 * seconds / max(a.steps, 1), 4),
        "tokens_per_s": round(tokens / seconds, 1),
        "precision": a.precision, "sdpa": a.sdpa, "compile": a.compile,
        "fused_adamw": a.fused_adamw, "adamw": adamw_impl,
        "clip_grad_norm": a.clip_grad_norm, "no_decay_params": exempt,
        "compile_s": None if compile_s is None else round(compile_s, 3),
        "warmup_s": round(warmup_s, 3), "timed_recompiles": recompiles}))


if __name__ == "__main__":
    main()
