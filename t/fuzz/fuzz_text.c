/*
 * fuzz_text.c - bert_train's readers of user files on untrusted bytes: the
 * bytes as a vocabulary file (bert_vocab_load) and as a corpus
 * (bert_dataset_create with that vocabulary when it loaded, else one
 * built from the corpus; then a batch of its samples). Never a crash, a
 * leak or a sanitizer report; errors are fine.
 */
#include "fuzz.h"

#include <stdlib.h>

#include "data.h"
#include "tokenizer.h"

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc, (void)argv;
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const char *path = fuzz_file(data, size);
  bert_vocab_t *v = NULL;
  int vocab_ok = bert_vocab_load(path, &v) == HVD_SUCCESS;
  bert_vocab_destroy(v);
  bert_data_options_t o;
  bert_data_options_init(&o);
  o.corpus_path = path;
  o.seq_len = 16;
  o.vocab_max = 512;
  o.vocab_path = vocab_ok ? path : NULL;
  bert_dataset_t *d = NULL;
  if (bert_dataset_create(&o, &d) == HVD_SUCCESS) {
    int64_t n = bert_dataset_size(d), idx[4];
    int32_t ids[4 * 16], labels[4 * 16], lengths[4];
    for (int i = 0; i < 4; i++)
      idx[i] = n > 0 ? (int64_t)i % n : 0;
    if (n > 0)
      (void)bert_dataset_batch(d, idx, 4, 1, ids, NULL, labels, lengths);
  }
  bert_dataset_destroy(d);
  return 0;
}
