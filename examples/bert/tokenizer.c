/*
 * tokenizer.c - word splitting, the vocabulary (a string table with an
 * open-addressing hash index) and its file. See tokenizer.h.
 */
#include "tokenizer.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const special[BERT_NUM_SPECIAL] = {"[PAD]", "[UNK]", "[CLS]",
                                                      "[SEP]", "[MASK]"};

struct bert_vocab {
  int n;
  char **tokens;  /* [n], each malloc'ed */
  int32_t *index; /* hash slots: id or -1 */
  uint64_t mask;  /* slots - 1 */
};

static int is_word_byte(unsigned char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
         (c >= '0' && c <= '9');
}
static char lower(char c) {
  return c >= 'A' && c <= 'Z' ? (char)(c - 'A' + 'a') : c;
}

/* FNV-1a of the lowercased bytes. */
static uint64_t hash_word(const char *s, size_t len) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (size_t i = 0; i < len; i++) {
    h ^= (unsigned char)lower(s[i]);
    h *= 0x100000001b3ULL;
  }
  return h;
}

/* Does the stored (lowercase) token equal word[0..len) lowercased? */
static int same_word(const char *token, const char *word, size_t len) {
  for (size_t i = 0; i < len; i++)
    if (token[i] == '\0' || token[i] != lower(word[i]))
      return 0;
  return token[len] == '\0';
}

/* Next word of text[*pos..len): sets *start and returns its length, or 0
 * at the end. */
static size_t next_word(const char *text, size_t len, size_t *pos,
                        size_t *start) {
  size_t i = *pos;
  while (i < len && !is_word_byte((unsigned char)text[i]))
    i++;
  *start = i;
  while (i < len && is_word_byte((unsigned char)text[i]))
    i++;
  *pos = i;
  return i - *start;
}

/* ---- A counting table used while building ------------------------------ */

typedef struct count_entry {
  char *word;
  int64_t count;
} count_entry_t;

typedef struct count_table {
  count_entry_t *e; /* slots; word NULL = empty */
  uint64_t mask;
  int64_t used;
} count_table_t;

static int count_grow(count_table_t *t) {
  uint64_t slots = t->e == NULL ? 1024 : (t->mask + 1) * 2;
  count_entry_t *e = calloc(slots, sizeof *e);
  if (e == NULL)
    return -1;
  for (uint64_t i = 0; t->e != NULL && i <= t->mask; i++) {
    if (t->e[i].word == NULL)
      continue;
    uint64_t h = hash_word(t->e[i].word, strlen(t->e[i].word)) & (slots - 1);
    while (e[h].word != NULL)
      h = (h + 1) & (slots - 1);
    e[h] = t->e[i];
  }
  free(t->e);
  t->e = e;
  t->mask = slots - 1;
  return 0;
}

static int count_add(count_table_t *t, const char *w, size_t len) {
  if (t->e == NULL || (uint64_t)(t->used + 1) * 2 > t->mask + 1)
    if (count_grow(t) != 0)
      return -1;
  uint64_t h = hash_word(w, len) & t->mask;
  while (t->e[h].word != NULL && !same_word(t->e[h].word, w, len))
    h = (h + 1) & t->mask;
  if (t->e[h].word == NULL) {
    char *s = malloc(len + 1);
    if (s == NULL)
      return -1;
    for (size_t i = 0; i < len; i++)
      s[i] = lower(w[i]);
    s[len] = '\0';
    t->e[h].word = s;
    t->used++;
  }
  t->e[h].count++;
  return 0;
}

static int by_count_then_word(const void *a, const void *b) {
  const count_entry_t *x = a, *y = b;
  if (x->count != y->count)
    return x->count > y->count ? -1 : 1;
  return strcmp(x->word, y->word);
}

/* ---- The vocabulary --------------------------------------------------------
 */

/* Allocates v for n tokens (tokens filled in by the caller, then
 * index_vocab). */
static bert_vocab_t *vocab_alloc(int n) {
  bert_vocab_t *v = calloc(1, sizeof *v);
  if (v == NULL)
    return NULL;
  v->tokens = calloc(n > 0 ? n : 1, sizeof *v->tokens);
  uint64_t slots = 16;
  while (slots < (uint64_t)n * 2)
    slots *= 2;
  v->index = malloc(slots * sizeof *v->index);
  if (v->tokens == NULL || v->index == NULL) {
    free(v->tokens);
    free(v->index);
    free(v);
    return NULL;
  }
  v->mask = slots - 1;
  memset(v->index, 0xff, slots * sizeof *v->index); /* -1 */
  v->n = n;
  return v;
}

/* Builds the hash index; returns the first id whose token repeats an
 * earlier one, or -1. */
static int index_vocab(bert_vocab_t *v) {
  for (int id = 0; id < v->n; id++) {
    const char *t = v->tokens[id];
    size_t len = strlen(t);
    uint64_t h = hash_word(t, len) & v->mask;
    while (v->index[h] >= 0) {
      if (strcmp(v->tokens[v->index[h]], t) == 0)
        return id;
      h = (h + 1) & v->mask;
    }
    v->index[h] = id;
  }
  return -1;
}

void bert_vocab_destroy(bert_vocab_t *v) {
  if (v == NULL)
    return;
  for (int i = 0; i < v->n; i++)
    free(v->tokens[i]);
  free(v->tokens);
  free(v->index);
  free(v);
}

hvd_result_t bert_vocab_build(const char *text, size_t len, int max_size,
                              bert_vocab_t **out) {
  hvd_result_t rc = HVD_SUCCESS;
  count_table_t t = {0};
  count_entry_t *list = NULL;
  bert_vocab_t *v = NULL;
  if (out == NULL || (text == NULL && len > 0))
    return bert__error(HVD_ERR_INVALID_ARG, "bert_vocab_build: NULL");
  *out = NULL;
  if (max_size > 0 && max_size <= BERT_NUM_SPECIAL)
    return bert__error(HVD_ERR_INVALID_ARG,
                       "vocabulary size %d leaves no room for words beside "
                       "the %d special tokens",
                       max_size, BERT_NUM_SPECIAL);
  size_t pos = 0, start, wl;
  while ((wl = next_word(text, len, &pos, &start)) > 0)
    if (count_add(&t, text + start, wl) != 0)
      goto nomem;
  if (t.used == 0) {
    rc =
        bert__error(HVD_ERR_INVALID_ARG, "no words to build a vocabulary from");
    goto done;
  }
  list = malloc((size_t)t.used * sizeof *list);
  if (list == NULL)
    goto nomem;
  int64_t k = 0;
  for (uint64_t i = 0; i <= t.mask; i++)
    if (t.e[i].word != NULL)
      list[k++] = t.e[i];
  qsort(list, (size_t)k, sizeof *list, by_count_then_word);
  int64_t words = k;
  if (max_size > 0 && words > max_size - BERT_NUM_SPECIAL)
    words = max_size - BERT_NUM_SPECIAL;
  v = vocab_alloc((int)(words + BERT_NUM_SPECIAL));
  if (v == NULL)
    goto nomem;
  for (int i = 0; i < v->n; i++) {
    const char *s =
        i < BERT_NUM_SPECIAL ? special[i] : list[i - BERT_NUM_SPECIAL].word;
    if ((v->tokens[i] = strdup(s)) == NULL)
      goto nomem;
  }
  index_vocab(v); /* words are distinct and never look like specials */
  *out = v;
  v = NULL;
  goto done;
nomem:
  rc = bert__error(HVD_ERR_NO_MEMORY, "out of memory building a vocabulary");
done:
  bert_vocab_destroy(v);
  for (uint64_t i = 0; t.e != NULL && i <= t.mask; i++)
    free(t.e[i].word);
  free(t.e);
  free(list);
  return rc;
}

hvd_result_t bert_vocab_save(const bert_vocab_t *v, const char *path) {
  if (v == NULL || path == NULL)
    return bert__error(HVD_ERR_INVALID_ARG, "bert_vocab_save: NULL");
  size_t n = strlen(path) + 5;
  char *tmp = malloc(n);
  if (tmp == NULL)
    return bert__error(HVD_ERR_NO_MEMORY, "out of memory");
  snprintf(tmp, n, "%s.tmp", path);
  hvd_result_t rc = HVD_SUCCESS;
  FILE *f = fopen(tmp, "w");
  if (f == NULL) {
    rc = bert__error(HVD_ERR_IO, "cannot write vocabulary '%s': %s", tmp,
                     strerror(errno));
    goto done;
  }
  int bad = 0;
  for (int i = 0; i < v->n; i++)
    bad |= fprintf(f, "%s\n", v->tokens[i]) < 0;
  bad |= fflush(f) != 0;
  int err = errno;
  bad |= fclose(f) != 0;
  if (bad || rename(tmp, path) != 0) {
    rc = bert__error(HVD_ERR_IO, "cannot write vocabulary '%s': %s", path,
                     strerror(bad ? err : errno));
    remove(tmp);
  }
done:
  free(tmp);
  return rc;
}

/* The whole of f (the file path) into *out, NUL-terminated, its length
 * into *out_len; *out is the caller's to free, after a failure too. */
static hvd_result_t read_whole(FILE *f, const char *path, char **out,
                               size_t *out_len) {
  hvd_result_t rc = HVD_SUCCESS;
  size_t cap = 1 << 16, len = 0, got;
  char *buf = malloc(cap + 1);
  if (buf == NULL)
    goto nomem;
  while ((got = fread(buf + len, 1, cap - len, f)) > 0) {
    len += got;
    if (len == cap) {
      char *p = realloc(buf, cap * 2 + 1);
      if (p == NULL)
        goto nomem;
      buf = p, cap *= 2;
    }
  }
  if (ferror(f)) {
    rc = bert__error(HVD_ERR_IO, "cannot read vocabulary '%s': %s", path,
                     strerror(errno));
    goto done;
  }
  buf[len] = '\0';
  goto done;
nomem:
  rc = bert__error(HVD_ERR_NO_MEMORY, "out of memory reading '%s'", path);
done:
  *out = buf;
  *out_len = len;
  return rc;
}

static int count_lines(const char *buf, size_t len) {
  int lines = 0;
  for (size_t i = 0; i < len; i++)
    lines += buf[i] == '\n';
  if (len > 0 && buf[len - 1] != '\n')
    lines++; /* a last line without its newline */
  return lines;
}

/* Line id + 1 of the file path holds token p (l bytes): the special
 * tokens first, in their order, then lowercase words of letters and
 * digits? */
static hvd_result_t check_token(const char *p, size_t l, int id,
                                const char *path) {
  hvd_result_t rc = HVD_SUCCESS;
  int ok = l > 0;
  if (id < BERT_NUM_SPECIAL) {
    ok = strcmp(p, special[id]) == 0;
  } else {
    for (size_t i = 0; ok && i < l; i++)
      ok = is_word_byte((unsigned char)p[i]) && lower(p[i]) == p[i];
  }
  if (!ok && id < BERT_NUM_SPECIAL)
    rc = bert__error(HVD_ERR_CORRUPT,
                     "vocabulary '%s' line %d: '%s' where '%s' belongs "
                     "(the special tokens come first)",
                     path, id + 1, p, special[id]);
  else if (!ok)
    rc = bert__error(HVD_ERR_CORRUPT,
                     "vocabulary '%s' line %d: '%s' is not a lowercase "
                     "word of letters and digits",
                     path, id + 1, p);
  return rc;
}

/* A text file has no NUL byte (a program, an archive, a checkpoint do):
 * the first one in buf's len bytes refused, naming its line (the token
 * reader below would stop a line at it). */
static hvd_result_t check_text(const char *buf, size_t len, const char *path) {
  const char *nul = memchr(buf, '\0', len);
  if (nul == NULL)
    return HVD_SUCCESS;
  int line = 1;
  for (const char *c = buf; c < nul; c++)
    line += *c == '\n';
  return bert__error(HVD_ERR_CORRUPT,
                     "vocabulary '%s' line %d: a NUL byte (not a text file)",
                     path, line);
}

/* The lines of buf (v has room for them all) as v's tokens, each
 * checked. */
static hvd_result_t read_tokens(bert_vocab_t *v, char *buf, int lines,
                                const char *path) {
  hvd_result_t rc = HVD_SUCCESS;
  char *p = buf;
  for (int id = 0; id < lines; id++) {
    char *nl = strchr(p, '\n');
    if (nl != NULL)
      *nl = '\0';
    size_t l = strlen(p);
    if (l > 0 && p[l - 1] == '\r')
      p[--l] = '\0';
    if ((rc = check_token(p, l, id, path)) != HVD_SUCCESS)
      goto done;
    if ((v->tokens[id] = strdup(p)) == NULL) {
      rc = bert__error(HVD_ERR_NO_MEMORY, "out of memory reading '%s'", path);
      goto done;
    }
    p = nl != NULL ? nl + 1 : p + l;
  }
done:
  return rc;
}

hvd_result_t bert_vocab_load(const char *path, bert_vocab_t **out) {
  hvd_result_t rc = HVD_SUCCESS;
  char *buf = NULL;
  size_t len = 0;
  bert_vocab_t *v = NULL;
  FILE *f = NULL;
  if (path == NULL || out == NULL)
    return bert__error(HVD_ERR_INVALID_ARG, "bert_vocab_load: NULL");
  *out = NULL;
  f = fopen(path, "rb");
  if (f == NULL)
    return bert__error(HVD_ERR_IO, "cannot open vocabulary '%s': %s", path,
                       strerror(errno));
  if ((rc = read_whole(f, path, &buf, &len)) != HVD_SUCCESS ||
      (rc = check_text(buf, len, path)) != HVD_SUCCESS)
    goto done;
  int lines = count_lines(buf, len);
  if (lines < BERT_NUM_SPECIAL) {
    rc = bert__error(HVD_ERR_CORRUPT,
                     "vocabulary '%s' has %d lines; it needs at least the "
                     "%d special tokens",
                     path, lines, BERT_NUM_SPECIAL);
    goto done;
  }
  if ((v = vocab_alloc(lines)) == NULL) {
    rc = bert__error(HVD_ERR_NO_MEMORY, "out of memory reading '%s'", path);
    goto done;
  }
  if ((rc = read_tokens(v, buf, lines, path)) != HVD_SUCCESS)
    goto done;
  int dup = index_vocab(v);
  if (dup >= 0) {
    rc = bert__error(HVD_ERR_CORRUPT,
                     "vocabulary '%s' line %d: '%s' appears twice", path,
                     dup + 1, v->tokens[dup]);
    goto done;
  }
  *out = v;
  v = NULL;
done:
  if (f != NULL)
    fclose(f);
  free(buf);
  bert_vocab_destroy(v);
  return rc;
}

int bert_vocab_size(const bert_vocab_t *v) { return v != NULL ? v->n : 0; }

const char *bert_vocab_token(const bert_vocab_t *v, int id) {
  return v != NULL && id >= 0 && id < v->n ? v->tokens[id] : NULL;
}

int bert_vocab_id(const bert_vocab_t *v, const char *word, size_t len) {
  if (v == NULL || word == NULL)
    return BERT_UNK_ID;
  uint64_t h = hash_word(word, len) & v->mask;
  while (v->index[h] >= 0) {
    if (same_word(v->tokens[v->index[h]], word, len))
      return v->index[h];
    h = (h + 1) & v->mask;
  }
  return BERT_UNK_ID;
}

hvd_result_t bert_tokenize(const bert_vocab_t *v, const char *text, size_t len,
                           int32_t **ids, int64_t *n) {
  if (v == NULL || ids == NULL || n == NULL || (text == NULL && len > 0))
    return bert__error(HVD_ERR_INVALID_ARG, "bert_tokenize: NULL");
  *ids = NULL;
  *n = 0;
  size_t pos = 0, start, wl;
  int64_t count = 0;
  while (next_word(text, len, &pos, &start) > 0)
    count++;
  if (count == 0)
    return HVD_SUCCESS;
  int32_t *out = malloc((size_t)count * sizeof *out);
  if (out == NULL)
    return bert__error(HVD_ERR_NO_MEMORY, "out of memory tokenizing");
  pos = 0;
  for (int64_t i = 0; (wl = next_word(text, len, &pos, &start)) > 0; i++)
    out[i] = bert_vocab_id(v, text + start, wl);
  *ids = out;
  *n = count;
  return HVD_SUCCESS;
}
