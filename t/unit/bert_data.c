/*
 * bert_data.c - the BERT example's data: the tokenizer (splitting,
 * vocabulary order and cap, its file), packing lines into samples, the
 * masking proportions and their determinism, the synthetic corpus, and
 * the errors for files that cannot serve.
 *
 * Masking bounds. Over the synthetic corpus at seq_len 64 (about 2,000
 * samples, 100,000 maskable words, 15,000 chosen), a proportion p of n
 * chosen tokens has standard deviation sqrt(p (1 - p) / n) <= 0.0033; the
 * checks allow 5 of those (0.016 for [MASK], 0.012 for the 10% shares),
 * so a correct implementation fails about once in 10^6 runs (and the data
 * are deterministic, so it never flakes), while a wrong split (70/15/15,
 * say) is 20 deviations away.
 */
#include "data.h"
#include "tap.h"
#include "tokenizer.h"
#include "util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char dir[64];

static const char *path_of(const char *name) {
  static char buf[4][128];
  static int k;
  char *p = buf[k++ % 4];
  snprintf(p, 128, "%s/%s", dir, name);
  return p;
}

static void write_file(const char *name, const char *text) {
  FILE *f = fopen(path_of(name), "w");
  if (f == NULL || fputs(text, f) < 0 || fclose(f) != 0)
    bail("cannot write %s", path_of(name));
}

/* The words of sample i, unmasked: labels where chosen, else the input. */
static void original(const int32_t *ids, const int32_t *labels, int n,
                     int32_t *out) {
  for (int i = 0; i < n; i++)
    out[i] = labels[i] != BERT_LABEL_IGNORE ? labels[i] : ids[i];
}

static void test_tokenizer(void) {
  const char *text = "The cat sat. the CAT, the dog! a b b\nHello-World_42x";
  bert_vocab_t *v = NULL, *w = NULL;
  is_int(HVD_SUCCESS, bert_vocab_build(text, strlen(text), 0, &v),
         "vocab: build");
  /* the 3; b, cat 2 (b < cat); then 1 each in strcmp order */
  static const char *const want[] = {
      "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "b",
      "cat",   "42x",   "a",     "dog",   "hello",  "sat", "world"};
  int n = (int)(sizeof want / sizeof want[0]), same = 1;
  is_int(n, bert_vocab_size(v), "vocab: 5 specials and 9 words");
  for (int i = 0; i < n; i++)
    same &= bert_vocab_token(v, i) != NULL &&
            strcmp(want[i], bert_vocab_token(v, i)) == 0;
  ok(same, "vocab: by count, then in strcmp order, after the specials");
  is_int(BERT_PAD_ID, 0, "[PAD] is 0");
  is_int(7, bert_vocab_id(v, "CaT", 3), "lookup lowercases");
  is_int(BERT_UNK_ID, bert_vocab_id(v, "zebra", 5), "an unknown word is [UNK]");
  ok(bert_vocab_token(v, n) == NULL, "no token beyond the vocabulary");

  int32_t *ids;
  int64_t k;
  const char *s = "Cat,dog;ZEBRA  hello_world";
  is_int(HVD_SUCCESS, bert_tokenize(v, s, strlen(s), &ids, &k), "tokenize");
  int32_t expect[] = {7, 10, BERT_UNK_ID, 11, 13};
  ok(k == 5 && memcmp(ids, expect, sizeof expect) == 0,
     "tokenize: lowercase words split at every non-alphanumeric byte");
  free(ids);
  is_int(HVD_SUCCESS, bert_tokenize(v, " ,.; ", 5, &ids, &k),
         "tokenize: no words");
  ok(k == 0 && ids == NULL, "... gives nothing");

  is_int(HVD_SUCCESS, bert_vocab_build(text, strlen(text), 7, &w),
         "vocab: build with a cap of 7");
  ok(bert_vocab_size(w) == 7 && strcmp(bert_vocab_token(w, 6), "b") == 0,
     "vocab: the cap keeps the most frequent words");
  is_int(BERT_UNK_ID, bert_vocab_id(w, "cat", 3), "... the rest are [UNK]");
  bert_vocab_destroy(w);
  w = NULL;
  is_int(HVD_ERR_INVALID_ARG, bert_vocab_build(text, strlen(text), 5, &w),
         "vocab: a cap with no room for words is refused");
  is_int(HVD_ERR_INVALID_ARG, bert_vocab_build("...", 3, 0, &w),
         "vocab: a text without words is refused");

  /* determinism, and the file */
  is_int(HVD_SUCCESS, bert_vocab_build(text, strlen(text), 0, &w),
         "vocab: build again");
  same = bert_vocab_size(v) == bert_vocab_size(w);
  for (int i = 0; same && i < bert_vocab_size(v); i++)
    same = strcmp(bert_vocab_token(v, i), bert_vocab_token(w, i)) == 0;
  ok(same, "vocab: the same text gives the same vocabulary");
  bert_vocab_destroy(w);
  w = NULL;
  is_int(HVD_SUCCESS, bert_vocab_save(v, path_of("vocab.txt")), "vocab: save");
  is_int(HVD_SUCCESS, bert_vocab_load(path_of("vocab.txt"), &w), "vocab: load");
  same = w != NULL && bert_vocab_size(v) == bert_vocab_size(w);
  for (int i = 0; same && i < bert_vocab_size(v); i++)
    same = strcmp(bert_vocab_token(v, i), bert_vocab_token(w, i)) == 0;
  ok(same && bert_vocab_id(w, "dog", 3) == 10,
     "vocab: saved and loaded, the same ids");
  ok(access(path_of("vocab.txt.tmp"), F_OK) != 0, "vocab: no temporary left");
  bert_vocab_destroy(w);
  w = NULL;

  is_int(HVD_ERR_IO, bert_vocab_load(path_of("nothing.txt"), &w),
         "vocab: a missing file is HVD_ERR_IO");
  ok(strstr(bert_last_error(), "nothing.txt") != NULL &&
         strstr(bert_last_error(), "No such file") != NULL,
     "... naming it and why: %s", bert_last_error());
  write_file("bad1.txt", "[PAD]\n[UNK]\n[SEP]\n[CLS]\n[MASK]\nword\n");
  is_int(HVD_ERR_CORRUPT, bert_vocab_load(path_of("bad1.txt"), &w),
         "vocab: specials out of order is HVD_ERR_CORRUPT");
  ok(strstr(bert_last_error(), "line 3") != NULL, "... naming the line: %s",
     bert_last_error());
  write_file("bad2.txt", "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nword\nWord\n");
  is_int(HVD_ERR_CORRUPT, bert_vocab_load(path_of("bad2.txt"), &w),
         "vocab: an uppercase token is refused: %s", bert_last_error());
  write_file("bad3.txt", "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nab\ncd\nab\n");
  is_int(HVD_ERR_CORRUPT, bert_vocab_load(path_of("bad3.txt"), &w),
         "vocab: a repeated token is refused: %s", bert_last_error());
  write_file("bad4.txt", "");
  is_int(HVD_ERR_CORRUPT, bert_vocab_load(path_of("bad4.txt"), &w),
         "vocab: an empty file is refused: %s", bert_last_error());
  /* a NUL byte: before, "ab\0cd" on line 6 was read as "ab", and the
   * next line reported as '' on line 7, or as the last line accepted */
  static const char nul6[] = "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nab\0cd\nef\n";
  static const char nul_last[] = "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nab\0cd\n";
  char want_err[256];
  const struct {
    const char *name, *what, *bytes;
    size_t len;
  } nuls[] = {{"nul6.txt", "on line 6 of 7", nul6, sizeof nul6 - 1},
              {"nul7.txt", "on the last line", nul_last, sizeof nul_last - 1}};
  for (int i = 0; i < 2; i++) {
    FILE *f = fopen(path_of(nuls[i].name), "wb");
    if (f == NULL || fwrite(nuls[i].bytes, 1, nuls[i].len, f) != nuls[i].len ||
        fclose(f) != 0)
      bail("cannot write %s", path_of(nuls[i].name));
    is_int(HVD_ERR_CORRUPT, bert_vocab_load(path_of(nuls[i].name), &w),
           "vocab: a NUL byte %s is HVD_ERR_CORRUPT", nuls[i].what);
    snprintf(want_err, sizeof want_err,
             "vocabulary '%s' line 6: a NUL byte (not a text file)",
             path_of(nuls[i].name));
    is_string(want_err, bert_last_error(), "... naming line 6");
    ok(w == NULL, "... and no vocabulary");
    bert_vocab_destroy(w);
    w = NULL;
  }
  bert_vocab_destroy(v);
}

static void test_packing(void) {
  /* room for 6 words between [CLS] and [SEP] */
  write_file("pack.txt", "a b c\nd e\n\n!!!\nf g h i\n"
                         "w1 w2 w3 w4 w5 w6 w7 w8 w9 w10 w11 w12 w13 w14\n"
                         "z\n");
  bert_data_options_t o;
  bert_data_options_init(&o);
  o.corpus_path = path_of("pack.txt");
  o.seq_len = 8;
  bert_dataset_t *d = NULL;
  if (!is_int(HVD_SUCCESS, bert_dataset_create(&o, &d), "pack: create"))
    diag("%s", bert_last_error());
  if (d == NULL)
    bail("no dataset");
  static const char *const want[] = {"a b c d e", "f g h i",
                                     "w1 w2 w3 w4 w5 w6",
                                     "w7 w8 w9 w10 w11 w12", "w13 w14 z"};
  int n = (int)(sizeof want / sizeof want[0]);
  is_int(n, bert_dataset_size(d), "pack: lines packed into %d samples", n);
  const bert_vocab_t *v = bert_dataset_vocab(d);
  int32_t ids[8], labels[8], words[8], len;
  for (int i = 0; i < n && i < bert_dataset_size(d); i++) {
    bert_dataset_get(d, i, 0, ids, labels, &len);
    original(ids, labels, 8, words);
    char got[128] = "";
    for (int j = 1; j < len - 1; j++) {
      strcat(got, j > 1 ? " " : "");
      strcat(got, bert_vocab_token(v, words[j]));
    }
    int frame = words[0] == BERT_CLS_ID && words[len - 1] == BERT_SEP_ID;
    for (int j = len; j < 8; j++)
      frame &= words[j] == BERT_PAD_ID && ids[j] == BERT_PAD_ID &&
               labels[j] == BERT_LABEL_IGNORE;
    ok(frame && strcmp(got, want[i]) == 0,
       "pack: sample %d is [CLS] %s [SEP] [PAD]... (got '%s', length %d)", i,
       want[i], got, len);
  }
  is_int(HVD_ERR_INVALID_ARG, bert_dataset_get(d, n, 0, ids, labels, &len),
         "pack: a sample beyond the end is refused");
  bert_dataset_destroy(d);
}

static void test_masking(void) {
  bert_data_options_t o;
  bert_data_options_init(&o);
  o.seq_len = 64;
  o.seed = 11;
  bert_dataset_t *d = NULL, *e = NULL;
  is_int(HVD_SUCCESS, bert_dataset_create(&o, &d), "synthetic: create");
  if (d == NULL)
    bail("no dataset: %s", bert_last_error());
  const int V = bert_vocab_size(bert_dataset_vocab(d)), S = o.seq_len;
  ok(V > 50 && V < 200, "synthetic: a small vocabulary (%d)", V);
  ok(bert_dataset_size(d) > 1000, "synthetic: %lld samples of %d tokens",
     (long long)bert_dataset_size(d), S);

  int64_t cand = 0, chosen = 0, masked = 0, random = 0, kept = 0;
  int64_t special_chosen = 0, bad_random = 0, bad_label = 0, padded = 0;
  int32_t *ids = malloc(sizeof(int32_t) * S),
          *labels = malloc(sizeof(int32_t) * S),
          *words = malloc(sizeof(int32_t) * S);
  for (int64_t i = 0; i < bert_dataset_size(d); i++) {
    int32_t len;
    bert_dataset_get(d, i, 0, ids, labels, &len);
    original(ids, labels, S, words);
    padded += len < S;
    for (int j = 0; j < S; j++) {
      cand += words[j] >= BERT_NUM_SPECIAL;
      if (labels[j] == BERT_LABEL_IGNORE) {
        bad_label += ids[j] == BERT_MASK_ID; /* masked but no label */
        continue;
      }
      chosen++;
      special_chosen += labels[j] < BERT_NUM_SPECIAL || j >= len;
      if (ids[j] == BERT_MASK_ID)
        masked++;
      else if (ids[j] == labels[j])
        kept++;
      else {
        random++;
        bad_random += ids[j] < BERT_NUM_SPECIAL || ids[j] >= V;
      }
    }
  }
  double pc = (double)chosen / cand, pm = (double)masked / chosen,
         pr = (double)random / chosen, pk = (double)kept / chosen;
  diag("%lld maskable, %lld chosen: [MASK] %.4f random %.4f kept %.4f",
       (long long)cand, (long long)chosen, pm, pr, pk);
  ok(fabs(pc - 0.15) < 0.005, "masking: %.4f of the words chosen (0.15)", pc);
  ok(fabs(pm - 0.8) < 0.016, "masking: %.4f of those [MASK] (0.8)", pm);
  ok(fabs(pr - 0.1) < 0.012, "masking: %.4f a random word (0.1)", pr);
  /* a random word may be the word itself: 0.1 + 0.1 / (V - 5) */
  ok(fabs(pk - (0.1 + 0.1 / (V - 5))) < 0.012, "masking: %.4f unchanged (0.1)",
     pk);
  is_int(0, special_chosen, "masking: [CLS], [SEP], [PAD] never chosen");
  is_int(0, bad_random, "masking: random words are never special tokens");
  is_int(0, bad_label, "masking: every [MASK] has its label");
  ok(padded > 0, "samples: %lld of them end in padding", (long long)padded);

  /* determinism: (seed, index, epoch) */
  int32_t *ids2 = malloc(sizeof(int32_t) * S),
          *labels2 = malloc(sizeof(int32_t) * S);
  is_int(HVD_SUCCESS, bert_dataset_create(&o, &e),
         "synthetic: a second dataset from the same options");
  int same = bert_dataset_size(d) == bert_dataset_size(e), epoch_differs = 0;
  for (int64_t i = 0; same && i < 200; i++) {
    bert_dataset_get(d, i, 3, ids, labels, NULL);
    bert_dataset_get(e, i, 3, ids2, labels2, NULL);
    same = memcmp(ids, ids2, sizeof(int32_t) * S) == 0 &&
           memcmp(labels, labels2, sizeof(int32_t) * S) == 0;
    bert_dataset_get(d, i, 4, ids2, labels2, NULL);
    epoch_differs += memcmp(labels, labels2, sizeof(int32_t) * S) != 0;
  }
  ok(same, "masking: the same (seed, index, epoch) gives the same sample "
           "in two datasets");
  ok(epoch_differs >= 190,
     "masking: another epoch masks differently (%d of "
     "200 samples)",
     epoch_differs);
  bert_dataset_destroy(e);
  e = NULL;
  o.seed = 12;
  bert_dataset_create(&o, &e);
  int seed_differs = 0;
  for (int64_t i = 0; e != NULL && i < 50; i++) {
    bert_dataset_get(d, i, 0, ids, labels, NULL);
    bert_dataset_get(e, i, 0, ids2, labels2, NULL);
    seed_differs += memcmp(ids, ids2, sizeof(int32_t) * S) != 0;
  }
  ok(seed_differs >= 45, "another seed, another corpus and masks (%d of 50)",
     seed_differs);

  /* a batch is its samples side by side */
  int64_t idx[3] = {5, 0, 17};
  int32_t *bids = malloc(sizeof(int32_t) * 3 * S),
          *btypes = malloc(sizeof(int32_t) * 3 * S),
          *blab = malloc(sizeof(int32_t) * 3 * S), blen[3];
  is_int(HVD_SUCCESS,
         bert_dataset_batch(d, idx, 3, 2, bids, btypes, blab, blen),
         "batch of 3");
  int32_t len;
  bert_dataset_get(d, 17, 2, ids, labels, &len);
  int zero_types = 1;
  for (int j = 0; j < 3 * S; j++)
    zero_types &= btypes[j] == 0;
  ok(memcmp(bids + 2 * S, ids, sizeof(int32_t) * S) == 0 &&
         memcmp(blab + 2 * S, labels, sizeof(int32_t) * S) == 0 &&
         blen[2] == len && zero_types,
     "batch: row 2 is sample 17, token types 0");
  idx[1] = -1;
  is_int(HVD_ERR_INVALID_ARG,
         bert_dataset_batch(d, idx, 3, 2, bids, btypes, blab, blen),
         "batch: an index out of range is refused");

  /* the vocabulary file read back gives the same samples */
  is_int(HVD_SUCCESS,
         bert_vocab_save(bert_dataset_vocab(d), path_of("synth.vocab")),
         "save the vocabulary next to the checkpoints");
  bert_dataset_destroy(e);
  e = NULL;
  o.seed = 11;
  o.vocab_path = path_of("synth.vocab");
  is_int(HVD_SUCCESS, bert_dataset_create(&o, &e),
         "a dataset with the saved vocabulary");
  same = e != NULL;
  for (int64_t i = 0; same && i < 50; i++) {
    bert_dataset_get(d, i, 0, ids, labels, NULL);
    bert_dataset_get(e, i, 0, ids2, labels2, NULL);
    same = memcmp(ids, ids2, sizeof(int32_t) * S) == 0;
  }
  ok(same, "... makes the same samples");

  /* masking one sequence directly: at least one word, never a special */
  int32_t seq[5] = {BERT_CLS_ID, 9, BERT_UNK_ID, 10, BERT_SEP_ID}, mi[5], ml[5];
  bert_mask_tokens(seq, 5, 20, 0.15, 1, 2, 3, mi, ml);
  int nl = 0, spec = 0;
  for (int j = 0; j < 5; j++) {
    nl += ml[j] != BERT_LABEL_IGNORE;
    spec += ml[j] != BERT_LABEL_IGNORE && seq[j] < BERT_NUM_SPECIAL;
  }
  ok(nl == 1 && spec == 0,
     "mask: a short sequence still gets one masked word, not [UNK]");
  free(ids), free(labels), free(words), free(ids2), free(labels2);
  free(bids), free(btypes), free(blab);
  bert_dataset_destroy(d);
  bert_dataset_destroy(e);
}

static void test_synthetic(void) {
  char *a = NULL, *b = NULL, *c = NULL;
  size_t la, lb, lc;
  bert_synthetic_corpus(5, 300, &a, &la);
  bert_synthetic_corpus(5, 300, &b, &lb);
  bert_synthetic_corpus(6, 300, &c, &lc);
  ok(a != NULL && la == lb && memcmp(a, b, la) == 0,
     "synthetic: the same seed gives the same text");
  ok(c != NULL && (la != lc || memcmp(a, c, la) != 0),
     "synthetic: another seed gives another text");
  int lines = 0;
  for (size_t i = 0; i < la; i++)
    lines += a[i] == '\n';
  is_int(300, lines, "synthetic: one sentence per line");
  free(a), free(b), free(c);
}

static void test_errors(void) {
  bert_data_options_t o;
  bert_data_options_init(&o);
  o.seq_len = 16;
  bert_dataset_t *d = NULL;

  o.corpus_path = path_of("missing.txt");
  is_int(HVD_ERR_IO, bert_dataset_create(&o, &d),
         "corpus: a missing file is HVD_ERR_IO");
  ok(strstr(bert_last_error(), "missing.txt") != NULL &&
         strstr(bert_last_error(), "No such file") != NULL,
     "... naming it and why: %s", bert_last_error());
  o.corpus_path = dir;
  is_int(HVD_ERR_IO, bert_dataset_create(&o, &d),
         "corpus: a directory is HVD_ERR_IO: %s", bert_last_error());

  write_file("empty.txt", "");
  o.corpus_path = path_of("empty.txt");
  is_int(HVD_ERR_INVALID_ARG, bert_dataset_create(&o, &d),
         "corpus: an empty file is refused");
  ok(strstr(bert_last_error(), "empty") != NULL, "... saying so: %s",
     bert_last_error());
  write_file("punct.txt", "... !!! ---\n\n  ;\n");
  o.corpus_path = path_of("punct.txt");
  is_int(HVD_ERR_INVALID_ARG, bert_dataset_create(&o, &d),
         "corpus: a file without words is refused: %s", bert_last_error());

  write_file("small.txt", "just a few words here\nand a second line\n");
  o.corpus_path = path_of("small.txt");
  o.min_samples = 8;
  is_int(HVD_ERR_INVALID_ARG, bert_dataset_create(&o, &d),
         "corpus: a file too small for one batch is refused");
  ok(strstr(bert_last_error(), "too small") != NULL &&
         strstr(bert_last_error(), "needs 8") != NULL,
     "... saying how small: %s", bert_last_error());
  ok(d == NULL, "... and no dataset is made");
  o.min_samples = 1;
  is_int(HVD_SUCCESS, bert_dataset_create(&o, &d),
         "corpus: the same file for a batch of 1");
  is_int(1, bert_dataset_size(d), "... one sample");
  bert_dataset_destroy(d);
  d = NULL;

  o.vocab_path = path_of("bad1.txt"); /* written by test_tokenizer */
  is_int(HVD_ERR_CORRUPT, bert_dataset_create(&o, &d),
         "corpus: a bad vocabulary file is HVD_ERR_CORRUPT");
  o.vocab_path = NULL;
  o.seq_len = 2;
  is_int(HVD_ERR_INVALID_ARG, bert_dataset_create(&o, &d),
         "corpus: a sequence length below 3 is refused");
}

static void cleanup(void) {
  static const char *const names[] = {
      "vocab.txt", "bad1.txt",  "bad2.txt",  "bad3.txt",  "bad4.txt",
      "pack.txt",  "empty.txt", "punct.txt", "small.txt", "synth.vocab"};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
    remove(path_of(names[i]));
  rmdir(dir);
}

int main(void) {
  snprintf(dir, sizeof dir, "/tmp/bert_data.XXXXXX");
  if (mkdtemp(dir) == NULL)
    bail("mkdtemp failed");
  test_tokenizer();
  test_packing();
  test_masking();
  test_synthetic();
  test_errors();
  cleanup();
  done_testing();
  return tap_exit_status();
}
