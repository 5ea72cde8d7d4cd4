/*
 * objects.c - byte objects across ranks, Horovod's broadcast_object and
 * allgather_object for C: a config struct, a vocabulary, a list of file
 * names, whose sizes the receivers do not know beforehand.
 *
 * Each call is two of the public collectives under names of its own,
 * "hvd.object.<name>.size" (the lengths, int64) and "hvd.object.<name>"
 * (the bytes, uint8), submitted together so that one negotiation cycle
 * can take both. The results are copies in malloc'd memory that the
 * caller frees with free(), on every rank alike.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/errors.h"
#include "core/api.h"

#define OBJECT_PREFIX "hvd.object."

/* "hvd.object.<name><suffix>", malloc'd; NULL when out of memory. */
static char *object_name(const char *name, const char *suffix) {
  size_t n = sizeof OBJECT_PREFIX + strlen(name) + strlen(suffix);
  char *s = malloc(n);
  if (s != NULL)
    snprintf(s, n, "%s%s%s", OBJECT_PREFIX, name, suffix);
  return s;
}

static hvd_result_t check_args(const char *fn, const char *name,
                               const void *data, size_t len, int sending,
                               void **out) {
  if (!hvd_is_initialized())
    return hvd__not_initialized(fn);
  if (name == NULL || name[0] == '\0')
    return hvd__set_error(HVD_ERR_INVALID_ARG, "%s: the name is %s", fn,
                          name == NULL ? "NULL" : "empty");
  if (out == NULL)
    return hvd__set_error(HVD_ERR_INVALID_ARG, "%s '%s': out is NULL", fn,
                          name);
  if (sending && data == NULL && len > 0)
    return hvd__set_error(HVD_ERR_INVALID_ARG,
                          "%s '%s': data is NULL with %zu bytes", fn, name,
                          len);
  if (len > (size_t)INT64_MAX)
    return hvd__set_error(HVD_ERR_INVALID_ARG, "%s '%s': %zu bytes", fn, name,
                          len);
  return HVD_SUCCESS;
}

/* Waits for both requests (NULL ones skipped); the first failure wins. */
static hvd_result_t wait_both(hvd_request_t *a, hvd_request_t *b) {
  hvd_result_t ra = a != NULL ? hvd_wait(a) : HVD_SUCCESS;
  char msg[HVD__ERRMSG_MAX];
  snprintf(msg, sizeof msg, "%s", hvd_last_error());
  hvd_result_t rb = b != NULL ? hvd_wait(b) : HVD_SUCCESS;
  if (ra != HVD_SUCCESS)
    return hvd__set_error_msg(ra, msg);
  return rb;
}

hvd_result_t hvd_broadcast_object(const char *name, const void *data,
                                  size_t len, int root, void **out,
                                  size_t *out_len) {
  static const char fn[] = "hvd_broadcast_object";
  char *size_name = NULL, *data_name = NULL;
  unsigned char *buf = NULL;
  hvd_result_t rc;
  int me = hvd__coll_rank(), size = hvd__coll_size();
  HVD__CHECK(check_args(fn, name, data, len, me == root, out));
  *out = NULL;
  if (out_len == NULL)
    return hvd__set_error(HVD_ERR_INVALID_ARG, "%s '%s': out_len is NULL", fn,
                          name);
  if (root < 0 || root >= size)
    return hvd__set_error(HVD_ERR_INVALID_ARG,
                          "%s '%s': root %d is out of range 0..%d", fn, name,
                          root, size - 1);
  size_name = object_name(name, ".size");
  data_name = object_name(name, "");
  if (size_name == NULL || data_name == NULL) {
    rc = hvd__set_error(HVD_ERR_NO_MEMORY, "%s '%s': out of memory", fn, name);
    goto fail;
  }
  int64_t n = me == root ? (int64_t)len : 0, one = 1;
  hvd_tensor_t tn = hvd_tensor_make(&n, HVD_INT64, 1, &one);
  HVD__CHECK(hvd_broadcast(size_name, &tn, root));
  /* Without a buffer this rank still takes part, with no bytes: the
   * others then fail on the shape instead of waiting for it. */
  buf = malloc(n > 0 ? (size_t)n : 1);
  int64_t have = buf != NULL ? n : 0;
  if (buf != NULL && me == root && n > 0)
    memcpy(buf, data, (size_t)n);
  hvd_tensor_t tb = hvd_tensor_make(buf, HVD_UINT8, 1, &have);
  HVD__CHECK(hvd_broadcast(data_name, &tb, root));
  if (buf == NULL) {
    rc = hvd__set_error(HVD_ERR_NO_MEMORY,
                        "%s '%s': out of memory for %lld bytes", fn, name,
                        (long long)n);
    goto fail;
  }
  *out = buf;
  *out_len = (size_t)n;
  buf = NULL;
fail:
  free(buf);
  free(size_name);
  free(data_name);
  return rc;
}

hvd_result_t hvd_allgather_object(const char *name, const void *data,
                                  size_t len, void **out, size_t *lens) {
  static const char fn[] = "hvd_allgather_object";
  char *size_name = NULL, *data_name = NULL;
  hvd_tensor_t sizes = {.data = NULL, .device = HVD_CPU};
  hvd_tensor_t bytes = {.data = NULL, .device = HVD_CPU};
  hvd_request_t *rs = NULL, *rb = NULL;
  hvd_result_t rc;
  HVD__CHECK(check_args(fn, name, data, len, 1, out));
  *out = NULL;
  size_name = object_name(name, ".size");
  data_name = object_name(name, "");
  if (size_name == NULL || data_name == NULL) {
    rc = hvd__set_error(HVD_ERR_NO_MEMORY, "%s '%s': out of memory", fn, name);
    goto fail;
  }
  int64_t n = (int64_t)len, one = 1;
  hvd_tensor_t tn = hvd_tensor_make(&n, HVD_INT64, 1, &one);
  hvd_tensor_t tb = hvd_tensor_make((void *)data, HVD_UINT8, 1, &n);
  HVD__CHECK(hvd_allgather_async(size_name, &tn, &sizes, &rs));
  rc = hvd_allgather_async(data_name, &tb, &bytes, &rb);
  hvd_result_t rw = wait_both(rs, rb);
  if (rc == HVD_SUCCESS)
    rc = rw;
  if (rc != HVD_SUCCESS)
    goto fail;
  if (bytes.data == NULL && (bytes.data = malloc(1)) == NULL) {
    rc = hvd__set_error(HVD_ERR_NO_MEMORY, "%s '%s': out of memory", fn, name);
    goto fail;
  }
  const int64_t *got = sizes.data;
  for (int r = 0; lens != NULL && r < hvd__coll_size(); r++)
    lens[r] = (size_t)got[r];
  *out = bytes.data; /* a host output: malloc'd */
  bytes.data = NULL;
fail:
  hvd_tensor_free(&sizes);
  hvd_tensor_free(&bytes);
  free(size_name);
  free(data_name);
  return rc;
}
