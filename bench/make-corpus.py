#!/usr/bin/env python3
"""make-corpus.py - a deterministic word-level corpus for examples/bert_train
--data with a vocabulary of exactly --words distinct words, for throughput
comparisons at BERT's real vocabulary size (bench/ddp-vs-hvd.sh,
doc/bench.md "hvd vs PyTorch DDP on CPU").

  python3 bench/make-corpus.py [--words N] [--lines N] [--seed N] > corpus.txt

The words are made-up lowercase strings of 2 to 4 syllables (ASCII letters
only, so that bert_train's tokenizer - lowercased runs of ASCII letters and
digits - sees each as one word), all distinct. Their frequencies follow
Zipf's law (the k-th word about 1/k as often as the first), with every word
occurring at least once: word k appears max(1, round(T p_k)) times, T the
corpus's tokens (--lines x the mean sentence length, about 22), p_k the
Zipf probability. All occurrences are shuffled, then cut into sentences
whose lengths are drawn from a gamma-like distribution (mean about 22
words, 3 to 80), one per line, the first word capitalised, a comma now and
then and a full stop at the end (the tokenizer drops them).

The default --words 30517 is BERT's vocabulary of 30,522 tokens less
bert_train's 5 special tokens ([PAD] [UNK] [CLS] [SEP] [MASK]): with
--vocab-size 30522 (the mini preset caps at 8192 otherwise), bert_train's
V is then exactly 30522 and no word is [UNK]. The output depends on the
options alone (a 64-bit generator of its own, not Python's random), so
the same command gives the same bytes with any Python 3; with the defaults
it prints the words' count and the tokens on stderr.
"""
import argparse
import math
import sys

MASK64 = (1 << 64) - 1


class Rng:
    """splitmix64: deterministic, independent of Python's version."""

    def __init__(self, seed):
        self.s = (seed * 0x9E3779B97F4A7C15 + 0x632BE59BD9B4E019) & MASK64

    def next(self):
        self.s = (self.s + 0x9E3779B97F4A7C15) & MASK64
        z = self.s
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
        return z ^ (z >> 31)

    def uniform(self):  # [0, 1)
        return (self.next() >> 11) * (1.0 / (1 << 53))

    def below(self, n):  # [0, n), n small: the modulo bias is negligible
        return self.next() % n


ONSETS = ["", "b", "br", "c", "ch", "cl", "d", "dr", "f", "fl", "g", "gr",
          "h", "j", "k", "l", "m", "n", "p", "pl", "pr", "qu", "r", "s",
          "sh", "sk", "sl", "st", "t", "th", "tr", "v", "w", "y", "z"]
VOWELS = ["a", "e", "i", "o", "u", "ai", "ea", "ee", "io", "oo", "ou", "y"]
CODAS = ["", "", "", "n", "r", "s", "t", "l", "m", "nd", "st", "ng", "ck"]


def make_words(rng, n):
    """n distinct made-up words, shorter ones more likely."""
    seen, words = set(), []
    while len(words) < n:
        syllables = 2 + (rng.uniform() < 0.45) + (rng.uniform() < 0.25)
        w = "".join(ONSETS[rng.below(len(ONSETS))] +
                    VOWELS[rng.below(len(VOWELS))] +
                    CODAS[rng.below(len(CODAS))] for _ in range(syllables))
        if w not in seen:
            seen.add(w)
            words.append(w)
    return words


def sentence_length(rng):
    """Sum of 4 exponentials of mean 5.5 (gamma, k=4): mean 22, sd 11;
    clipped to [3, 80] words."""
    x = sum(-math.log(1.0 - rng.uniform()) for _ in range(4)) * 5.5
    return max(3, min(80, int(round(x))))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--words", type=int, default=30517,
                    help="distinct words (default 30517: V = 30522 in "
                    "bert_train with its 5 special tokens)")
    ap.add_argument("--lines", type=int, default=20000,
                    help="about this many sentences (default 20000, "
                    "about 440,000 words)")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    if a.words < 1 or a.lines < 1:
        ap.error("--words and --lines must be positive")

    rng = Rng(a.seed)
    words = make_words(rng, a.words)
    total = a.lines * 22
    h = sum(1.0 / k for k in range(1, a.words + 1))
    tokens = []
    for k, w in enumerate(words, 1):
        tokens.extend([w] * max(1, int(round(total / (k * h)))))
    for i in range(len(tokens) - 1, 0, -1):  # Fisher-Yates
        j = rng.below(i + 1)
        tokens[i], tokens[j] = tokens[j], tokens[i]

    out, i, nlines = [], 0, 0
    while i < len(tokens):
        n = sentence_length(rng)
        s = tokens[i:i + n]
        i += n
        s[0] = s[0].capitalize()
        for j in range(1, len(s) - 1):
            if rng.uniform() < 0.04:
                s[j] += ","
        out.append(" ".join(s) + ".")
        nlines += 1
    sys.stdout.write("\n".join(out) + "\n")
    print(f"make-corpus.py: {a.words} distinct words, {len(tokens)} words in "
          f"{nlines} lines (seed {a.seed})", file=sys.stderr)


if __name__ == "__main__":
    main()
