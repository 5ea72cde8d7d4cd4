/*
 * table.h - a string-keyed hash table of pointers (names -> requests,
 * names -> pending negotiations). Keys are copied (or borrowed, see
 * hvd__table_create_borrowing); values are borrowed.
 * Not thread-safe: the owner locks.
 */
#ifndef HVD_BASE_TABLE_H
#define HVD_BASE_TABLE_H

#include <stddef.h>

typedef struct hvd__table hvd__table_t;

hvd__table_t *hvd__table_create(void); /* NULL when out of memory */
/* A table that borrows its keys: each key must stay valid, unchanged,
 * until its entry is removed (names of requests in flight). */
hvd__table_t *hvd__table_create_borrowing(void);
void hvd__table_destroy(hvd__table_t *t); /* accepts NULL; values untouched */
void *hvd__table_get(const hvd__table_t *t, const char *key);
/* 0 on success, -1 when out of memory. Replaces an existing value. */
int hvd__table_put(hvd__table_t *t, const char *key, void *value);
/* Removes key and returns its value (NULL if absent). */
void *hvd__table_remove(hvd__table_t *t, const char *key);
size_t hvd__table_count(const hvd__table_t *t);
/* Calls fn for every entry, in no particular order; fn must not change t. */
void hvd__table_each(const hvd__table_t *t,
                     void (*fn)(const char *key, void *value, void *arg),
                     void *arg);

#endif /* HVD_BASE_TABLE_H */
