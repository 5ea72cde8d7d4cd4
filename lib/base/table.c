/* table.c - chained hash table with FNV-1a, doubling at load 1. */
#include "base/table.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct node {
  struct node *next;
  uint64_t hash;
  void *value;
  const char *key; /* points at copy[] unless the table borrows keys */
  char copy[];
} node_t;

struct hvd__table {
  node_t **slots;
  size_t nslots, count;
  int borrow;
};

static uint64_t fnv1a(const char *s) {
  uint64_t h = 1469598103934665603ull;
  for (; *s; s++)
    h = (h ^ (unsigned char)*s) * 1099511628211ull;
  return h;
}

hvd__table_t *hvd__table_create(void) {
  hvd__table_t *t = calloc(1, sizeof *t);
  if (t == NULL)
    return NULL;
  t->nslots = 64;
  t->slots = calloc(t->nslots, sizeof *t->slots);
  if (t->slots == NULL) {
    free(t);
    return NULL;
  }
  return t;
}

hvd__table_t *hvd__table_create_borrowing(void) {
  hvd__table_t *t = hvd__table_create();
  if (t != NULL)
    t->borrow = 1;
  return t;
}

void hvd__table_destroy(hvd__table_t *t) {
  if (t == NULL)
    return;
  for (size_t i = 0; i < t->nslots; i++)
    for (node_t *n = t->slots[i], *next; n != NULL; n = next) {
      next = n->next;
      free(n);
    }
  free(t->slots);
  free(t);
}

static node_t **find(const hvd__table_t *t, const char *key, uint64_t h) {
  node_t **p = &t->slots[h & (t->nslots - 1)];
  while (*p != NULL && ((*p)->hash != h || strcmp((*p)->key, key) != 0))
    p = &(*p)->next;
  return p;
}

void *hvd__table_get(const hvd__table_t *t, const char *key) {
  node_t *n = *find(t, key, fnv1a(key));
  return n ? n->value : NULL;
}

static void grow(hvd__table_t *t) {
  size_t nslots = t->nslots * 2;
  node_t **slots = calloc(nslots, sizeof *slots);
  if (slots == NULL)
    return; /* keep working at a higher load */
  for (size_t i = 0; i < t->nslots; i++)
    for (node_t *n = t->slots[i], *next; n != NULL; n = next) {
      next = n->next;
      n->next = slots[n->hash & (nslots - 1)];
      slots[n->hash & (nslots - 1)] = n;
    }
  free(t->slots);
  t->slots = slots;
  t->nslots = nslots;
}

int hvd__table_put(hvd__table_t *t, const char *key, void *value) {
  uint64_t h = fnv1a(key);
  node_t **p = find(t, key, h);
  if (*p != NULL) {
    (*p)->value = value;
    return 0;
  }
  size_t len = t->borrow ? 0 : strlen(key) + 1;
  node_t *n = malloc(sizeof *n + len);
  if (n == NULL)
    return -1;
  if (t->borrow) {
    n->key = key;
  } else {
    memcpy(n->copy, key, len);
    n->key = n->copy;
  }
  n->hash = h;
  n->value = value;
  n->next = NULL;
  *p = n;
  if (++t->count > t->nslots)
    grow(t);
  return 0;
}

void *hvd__table_remove(hvd__table_t *t, const char *key) {
  node_t **p = find(t, key, fnv1a(key));
  node_t *n = *p;
  if (n == NULL)
    return NULL;
  void *value = n->value;
  *p = n->next;
  free(n);
  t->count--;
  return value;
}

size_t hvd__table_count(const hvd__table_t *t) { return t->count; }

void hvd__table_each(const hvd__table_t *t,
                     void (*fn)(const char *key, void *value, void *arg),
                     void *arg) {
  for (size_t i = 0; i < t->nslots; i++)
    for (node_t *n = t->slots[i]; n != NULL; n = n->next)
      fn(n->key, n->value, arg);
}
