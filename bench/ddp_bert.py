#!/usr/bin/env python3
"""ddp_bert.py - examples/bert_train's CPU data-parallel training in PyTorch
DistributedDataParallel (gloo), to compare hvd's throughput with DDP's on
the same machine (bench/ddp-vs-hvd.sh, doc/bench.md "hvd vs PyTorch DDP on
CPU").

  python3 bench/ddp_bert.py --nproc 2 --data corpus.txt --steps 25
  torchrun --nproc_per_node 2 bench/ddp_bert.py --data corpus.txt --steps 25

The model is examples/bert/torch_bert.py's Bert (imported from there, not
copied: the model of examples/bert operation for operation, no dropout),
float32 on the CPU, wrapped in DistributedDataParallel with its defaults
(25 MB buckets, gradients averaged over the ranks by gloo allreduces that
overlap the backward pass; --bucket-cap-mb and --gradient-as-bucket-view
change them). The rest follows bert_train:

  - data: --data FILE is read and tokenized as bert_train does
    (examples/bert/tokenizer.c, data.c): lowercased runs of ASCII letters
    and digits; the vocabulary is the 5 special tokens then the words by
    count, most frequent first, ties in byte order, capped at
    --vocab-size tokens; lines packed greedily into samples of --seq
    tokens ([CLS] words [SEP] [PAD]...); a line is split only when longer
    than a sample. The model's V is the vocabulary's size, as bert_train's.
    Without --data: torch_bert.make_batch's synthetic batches of --vocab
    tokens;
  - each step, each rank takes --batch samples of its share of a shuffled
    epoch (every P-th entry of a seeded permutation, drop_last) and masks
    them as bert_train does: exactly round(15 % of the real words) per
    sample (at least 1), 80 % [MASK], 10 % a random word, 10 % kept;
  - AdamW with bert_train's defaults (lr 0.002, betas 0.9/0.999, eps 1e-8,
    weight decay 0.01 on every parameter, or not on those --no-decay
    names, in a second parameter group; --clip-grad-norm X calls
    clip_grad_norm_ between backward and step), the learning rate warmed up
    linearly over --warmup-steps (default steps/10) then decayed linearly
    to 0 at the last step, as bert_train;
  - each step reads the global loss back: one small allreduce of the
    ranks' masked-token loss sums and counts, then .item(), as bert_train
    does (its loss is the mean over the global batch's masked tokens);
  - one thread per rank (--threads 1: torch.set_num_threads and
    set_num_interop_threads, and OMP_NUM_THREADS / OPENBLAS_NUM_THREADS
    before torch is imported), each rank bound to its own CPU (--bind, on
    by default: rank r gets the r-th allowed CPU, as mpirun's default
    --bind-to core at 2 ranks does for bert_train under bin/hvdrun).

--no-sync trains without any gradient reduction (DDP's no_sync() on every
step: each rank updates its own copy), the compute ceiling, as bert_train
--no-sync.

Output (rank 0): two banner lines, then bert_train's summary line:

  done  steps 25  final loss 7.8 (mean of last 10)  tokens/s 3300 (mean,
  first 2 steps excluded)  world size 2  preset mini  time 14.1s

tokens/s = world size x batch x seq (padding included, as bert_train
counts them) x the steps after the first --skip (2, as bert_train) /
their wall time on rank 0, from the end of step --skip to the end of the
last step (bert_train sums its step times over the same steps; the
difference, the loop's bookkeeping between steps, is microseconds).

Launching: --nproc N (default 2) spawns N ranks with
torch.multiprocessing (gloo rendezvous on 127.0.0.1, a free port); under
torchrun (RANK and WORLD_SIZE set) the script is one rank and --nproc is
ignored. (Debian 12's python3-torch 1.13 ships a torchrun that fails at
start under Python 3.11, "AttributeError: 'NoneType' object has no
attribute 'get'" in elastic/multiprocessing/api.py to_map; the spawn
launcher does not use it. Ranks started by hand with RANK, WORLD_SIZE,
MASTER_ADDR and MASTER_PORT set work as under torchrun.)
"""
import argparse
import os
import socket
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.dont_write_bytecode = True  # no __pycache__ in the source tree


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", choices=["tiny", "mini", "base"], default="mini")
    ap.add_argument("--data", help="UTF-8 text, one sentence per line "
                    "(default: torch_bert.py's synthetic batches)")
    ap.add_argument("--vocab-size", type=int, default=30522,
                    help="cap of the vocabulary built from --data (tokens, "
                    "the 5 specials included; default 30522)")
    ap.add_argument("--vocab", type=int, default=30522,
                    help="V of the synthetic batches without --data")
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--batch", type=int, default=8, help="sequences per rank")
    ap.add_argument("--steps", type=int, default=25)
    ap.add_argument("--skip", type=int, default=2,
                    help="first steps left out of tokens/s (bert_train: 2)")
    ap.add_argument("--lr", type=float, default=0.002)
    ap.add_argument("--warmup-steps", type=int, default=-1,
                    help="default steps/10, as bert_train")
    ap.add_argument("--weight-decay", type=float, default=0.01)
    ap.add_argument("--no-decay", default="",
                    help="comma-separated name parts: parameters whose names "
                         "hold one get weight decay 0 (bert_train --no-decay; "
                         "BERT's recipe: bias,LayerNorm.weight)")
    ap.add_argument("--clip-grad-norm", type=float, default=0.0,
                    help="clip_grad_norm_ to this norm between backward and "
                         "step (bert_train --clip-grad-norm; 0: off)")
    ap.add_argument("--beta1", type=float, default=0.9)
    ap.add_argument("--beta2", type=float, default=0.999)
    ap.add_argument("--eps", type=float, default=1e-8)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--threads", type=int, default=1, help="per rank")
    ap.add_argument("--nproc", type=int, default=2,
                    help="ranks to spawn (not under torchrun)")
    ap.add_argument("--bind", dest="bind", action="store_true", default=True,
                    help="bind rank r to the r-th allowed CPU (default)")
    ap.add_argument("--no-bind", dest="bind", action="store_false")
    ap.add_argument("--bucket-cap-mb", type=float, default=25.0,
                    help="DDP's bucket size (default 25, DDP's default)")
    ap.add_argument("--gradient-as-bucket-view", action="store_true",
                    help="DDP's gradient_as_bucket_view (default off, as DDP)")
    ap.add_argument("--no-sync", action="store_true",
                    help="no gradient reduction (DDP no_sync on every step)")
    ap.add_argument("--model-dir", default=os.path.join(HERE, "..", "examples",
                                                        "bert"),
                    help="where torch_bert.py is (default ../examples/bert)")
    a = ap.parse_args(argv)
    if min(a.seq, a.batch, a.steps, a.threads, a.nproc) < 1 or a.seq < 3:
        ap.error("--seq (>= 3), --batch, --steps, --threads and --nproc must "
                 "be positive")
    if a.skip < 0 or a.skip >= a.steps:
        ap.error("--skip must be in [0, --steps)")
    if a.warmup_steps < 0:
        a.warmup_steps = a.steps // 10
    return a


# ---- Data: bert_train's tokenizer and packing (examples/bert/data.c) ----

NUM_SPECIAL, PAD_ID, UNK_ID, CLS_ID, SEP_ID, MASK_ID = 5, 0, 1, 2, 3, 4


def read_corpus(path, vocab_max, seq):
    """(samples, V): the packed samples as lists of word ids, the
    vocabulary's size; as bert_vocab_build + bert_dataset_create."""
    import re
    from collections import Counter
    with open(path, "rb") as f:
        text = f.read().lower()
    word = re.compile(rb"[a-z0-9]+")
    counts = Counter(word.findall(text))
    if not counts:
        sys.exit(f"ddp_bert.py: corpus '{path}' has no words")
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    if vocab_max > 0:
        ranked = ranked[:max(vocab_max - NUM_SPECIAL, 1)]
    ids = {w: NUM_SPECIAL + i for i, (w, _) in enumerate(ranked)}
    room = seq - 2
    samples, cur = [], []
    for line in text.split(b"\n"):
        toks = [ids.get(w, UNK_ID) for w in word.findall(line)]
        if not toks:
            continue
        if len(cur) + len(toks) > room and cur:
            samples.append(cur)
            cur = []
        while toks:
            k = room - len(cur)
            cur.extend(toks[:k])
            toks = toks[k:]
            if len(cur) == room:
                samples.append(cur)
                cur = []
    if cur:
        samples.append(cur)
    return samples, NUM_SPECIAL + len(ranked)


class Dataset:
    """Samples as a [N, S] tensor ([CLS] words [SEP] [PAD]...) and their
    lengths; batches of a rank's share of a seeded permutation per epoch;
    bert_train's masking."""

    def __init__(self, torch, samples, V, seq, seed, rank, world, batch):
        self.torch, self.V, self.S, self.B = torch, V, seq, batch
        self.seed, self.rank, self.world = seed, rank, world
        n = len(samples)
        self.tok = torch.full((n, seq), PAD_ID, dtype=torch.long)
        self.len = torch.empty(n, dtype=torch.long)
        for i, s in enumerate(samples):
            self.tok[i, 0] = CLS_ID
            self.tok[i, 1:len(s) + 1] = torch.tensor(s, dtype=torch.long)
            self.tok[i, len(s) + 1] = SEP_ID
            self.len[i] = len(s) + 2
        self.steps_per_epoch = n // (world * batch)
        if self.steps_per_epoch < 1:
            sys.exit(f"ddp_bert.py: the corpus makes {n} samples; one global "
                     f"batch needs {world * batch}")
        self.gen = torch.Generator().manual_seed(seed * 1000003 + rank)
        self.epoch, self.order = -1, None

    def batch(self, step):
        torch = self.torch
        epoch, s = divmod(step, self.steps_per_epoch)
        if epoch != self.epoch:
            g = torch.Generator().manual_seed(self.seed + epoch)
            perm = torch.randperm(self.tok.shape[0], generator=g)
            self.order, self.epoch = perm[self.rank::self.world], epoch
        idx = self.order[s * self.B:(s + 1) * self.B]
        ids = self.tok[idx].clone()
        lengths = self.len[idx].clone()
        cand = ids >= NUM_SPECIAL
        k = (cand.sum(1).double() * 0.15).round().long().clamp(min=1)
        k = torch.minimum(k, cand.sum(1))
        # exactly k[b] of row b's candidates, each subset equally likely
        score = torch.rand(ids.shape, generator=self.gen)
        score[~cand] = 2.0
        rank_in_row = score.argsort(1).argsort(1)
        chosen = cand & (rank_in_row < k[:, None])
        targets = ids[chosen]
        rows = chosen.reshape(-1).nonzero().squeeze(1)
        u = torch.rand(ids.shape, generator=self.gen)
        rand_words = torch.randint(NUM_SPECIAL, self.V, ids.shape,
                                   generator=self.gen)
        ids = torch.where(chosen & (u < 0.8), torch.full_like(ids, MASK_ID), ids)
        ids = torch.where(chosen & (u >= 0.8) & (u < 0.9), rand_words, ids)
        return ids, torch.zeros_like(ids), lengths, rows, targets


class Synthetic:
    """torch_bert.make_batch's batches, made each step."""

    def __init__(self, torch, tb, V, seq, seed, rank, batch):
        self.tb, self.V, self.S, self.B = tb, V, seq, batch
        self.gen = torch.Generator().manual_seed(seed * 1000003 + rank)

    def batch(self, step):
        return self.tb.make_batch(self.gen, self.B, self.S, self.V)


# ---- One rank ----

def worker(rank, world, a, port):
    os.environ.setdefault("OMP_NUM_THREADS", str(a.threads))
    os.environ.setdefault("OPENBLAS_NUM_THREADS", str(a.threads))
    os.environ.setdefault("MKL_NUM_THREADS", str(a.threads))
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    if a.bind and hasattr(os, "sched_setaffinity"):
        local = int(os.environ.get("LOCAL_RANK", rank))  # torchrun: per node
        cpus = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cpus[local % len(cpus)]})
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    torch.set_num_threads(a.threads)
    try:
        torch.set_num_interop_threads(a.threads)
    except RuntimeError:
        pass  # already set (torchrun imported torch first)
    sys.path.insert(0, os.path.abspath(a.model_dir))
    import torch_bert as tb

    if port is None:
        dist.init_process_group("gloo")  # torchrun: env://
    else:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}",
                                rank=rank, world_size=world)
    L, H, A, Fi, V, P = tb.PRESETS[a.preset]
    if a.data:
        samples, V = read_corpus(a.data, a.vocab_size, a.seq)
        data = Dataset(torch, samples, V, a.seq, a.seed, rank, world, a.batch)
        what = (f"data {a.data}: {len(samples)} sequences of {a.seq} tokens, "
                f"vocabulary {V}")
    else:
        V = a.vocab
        data = Synthetic(torch, tb, V, a.seq, a.seed, rank, a.batch)
        what = f"data synthetic (torch_bert.make_batch), vocabulary {V}"
    P = max(P, a.seq)

    torch.manual_seed(a.seed)  # the same initial weights on every rank
    model = tb.Bert(L, H, A, Fi, V, P)
    ddp = DDP(model, bucket_cap_mb=a.bucket_cap_mb,  # broadcasts rank 0's
              gradient_as_bucket_view=a.gradient_as_bucket_view)  # params
    parts = [x for x in a.no_decay.split(",") if x]
    # matched as bert_train's names: torch_bert's "emb_ln.weight" is its
    # "embeddings.LayerNorm.weight" (the biases are "bias" in both)
    named = [(n.replace("ln.", "LayerNorm."), p)
             for n, p in model.named_parameters()]
    exempt = [p for n, p in named if any(x in n for x in parts)]
    groups = [{"params": [p for n, p in named
                          if not any(x in n for x in parts)]}]
    if exempt:  # HF's recipe: the same AdamW, decay 0 for these
        groups.append({"params": exempt, "weight_decay": 0.0})
    opt = torch.optim.AdamW(groups, lr=a.lr, betas=(a.beta1, a.beta2),
                            eps=a.eps, weight_decay=a.weight_decay)
    W, T = a.warmup_steps, a.steps

    def lr_at(s):  # bert_train's schedule, as a factor of the peak
        return (s + 1) / W if s < W else (T - s) / (T - W)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)
    if rank == 0:
        nw = sum(p.numel() for p in model.parameters())
        print(f"ddp_bert: preset {a.preset} (L={L} H={H} A={A} F={Fi} V={V} "
              f"P={P} S={a.seq} B={a.batch}), {nw} weights; {world} ranks, "
              f"torch {torch.__version__} threads {torch.get_num_threads()}, "
              f"gloo, DDP {'no_sync' if a.no_sync else 'averaging'} "
              f"(buckets {a.bucket_cap_mb:g} MB"
              f"{', gradient_as_bucket_view' if a.gradient_as_bucket_view else ''})",
              flush=True)
        print(f"ddp_bert: {what}; global batch {world * a.batch}; AdamW lr "
              f"{a.lr} warmup {W} then linear decay to 0 at step {T}, weight "
              f"decay {a.weight_decay}"
              f"{f' (0 for {len(exempt)} parameters)' if parts else ''}"
              f"{f'; clip_grad_norm_ {a.clip_grad_norm:g}' if a.clip_grad_norm > 0 else ''}",
              flush=True)

    losses, t_skip = [], None
    t0 = time.perf_counter()
    for step in range(T):
        ids, types, lengths, rows, targets = data.batch(step)
        opt.zero_grad()
        if a.no_sync:
            with ddp.no_sync():
                loss = ddp(ids, types, lengths, rows, targets)
                loss.backward()
        else:
            loss = ddp(ids, types, lengths, rows, targets)
            loss.backward()
        if a.clip_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(),
                                           a.clip_grad_norm)
        opt.step()
        sched.step()
        if a.no_sync:
            losses.append(loss.item())  # rank 0's own, as bert_train
        else:  # the global batch's mean over its masked tokens
            m = float(targets.numel())
            t = torch.tensor([loss.item() * m, m], dtype=torch.float64)
            dist.all_reduce(t)
            losses.append((t[0] / t[1]).item())
        if step + 1 == a.skip:
            t_skip = time.perf_counter()
    t1 = time.perf_counter()
    if t_skip is None:
        t_skip = t0
    if rank == 0:
        timed = T - a.skip
        tps = world * a.batch * a.seq * timed / (t1 - t_skip)
        last = losses[-10:]
        print(f"done  steps {T}  final loss {sum(last) / len(last):.4f} (mean "
              f"of last {len(last)})  tokens/s {tps:.0f} (mean, first "
              f"{a.skip} steps excluded)  world size {world}  preset "
              f"{a.preset}  time {t1 - t0:.1f}s", flush=True)
    dist.barrier()
    dist.destroy_process_group()


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    a = parse_args()
    # before torch is imported here or in the spawned ranks
    for v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(v, str(a.threads))
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # torchrun
        worker(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), a, None)
        return
    import torch.multiprocessing as mp
    mp.spawn(worker, args=(a.nproc, a, free_port()), nprocs=a.nproc)


if __name__ == "__main__":
    main()
