/*
 * message.c - the negotiation's wire codec (lib/core/message.c): a
 * request's descriptor goes through unchanged, and one whose collective,
 * dtype, op or wire dtype is out of range (a peer's bad byte, another
 * build) is refused when read, so that no table is indexed with it.
 * A group's size and index out of bounds (group_n below 0 or past
 * HVD__GROUP_MAX, group_i outside [0, group_n), or not 0 outside a group)
 * is refused too: the coordinator sizes arrays by them. A response list
 * is refused, HVD_ERR_INTERNAL "malformed response list", when its count
 * is negative or more than its bytes can hold (not handed to calloc: not
 * HVD_ERR_NO_MEMORY), when a response's kind is out of range, and when it
 * is empty; a list of the smallest responses goes through.
 * Linked against libhvd.a (the codec is not exported). One process.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/errors.h"
#include "core/message.h"
#include "core/request.h"
#include "tap.h"

/* r's request through the codec: 0 and *d, or -1 when refused. */
static int round_trip(const hvd_request_t *r, hvd__desc_t *d) {
  hvd__wbuf_t w;
  hvd__rbuf_t rb;
  char *name = NULL;
  double ready = 0;
  memset(&w, 0, sizeof w);
  hvd__msg_put_request(&w, r);
  hvd__r_init(&rb, w.data, w.len);
  int got = hvd__msg_get_request(&rb, &name, d, &ready);
  if (got == 0 && (strcmp(name, r->name) != 0 || ready != r->t_ready))
    got = -2;
  free(name);
  hvd__w_free(&w);
  return got;
}

static hvd_request_t *make(void) {
  hvd_request_t *r = hvd__request_new("w.grad");
  if (r == NULL)
    bail("out of memory");
  r->desc.coll = HVD__REDUCESCATTER;
  r->desc.dtype = HVD_BFLOAT16;
  r->desc.device = 3;
  r->desc.ndim = 2;
  r->desc.shape[0] = 7;
  r->desc.shape[1] = 5;
  r->desc.op = HVD_PRODUCT;
  r->desc.prescale = 0.5;
  r->desc.postscale = 4;
  r->desc.root = 1;
  r->desc.wire = HVD_FLOAT16;
  r->desc.group_n = 3;
  r->desc.group_i = 2;
  r->desc.group_id = 0x1234567890abcdefull;
  r->t_ready = 1.25;
  return r;
}

/* A group's size and index through the codec. */
static int group_trip(int n, int i) {
  hvd__desc_t d;
  hvd_request_t *r = make();
  r->desc.group_n = n;
  r->desc.group_i = i;
  int got = round_trip(r, &d);
  hvd__request_free(r);
  return got;
}

/* The groups' bounds: what goes through and what is refused. */
static void groups(void) {
  static const struct {
    int n, i, want;
    const char *what;
  } cases[] = {
      {0, 0, 0, "no group"},
      {1, 0, 0, "a group of one"},
      {HVD__GROUP_MAX, HVD__GROUP_MAX - 1, 0, "the last of the largest group"},
      {-1, 0, -1, "a negative group size"},
      {INT32_MIN, 0, -1, "the most negative group size"},
      {HVD__GROUP_MAX + 1, 0, -1, "a group past HVD__GROUP_MAX"},
      {2, 2, -1, "an index past the group"},
      {2, -1, -1, "a negative index"},
      {0, 1, -1, "an index outside a group"},
  };
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++)
    is_int(cases[k].want, group_trip(cases[k].n, cases[k].i),
           "group_n %d, group_i %d: %s: %s", cases[k].n, cases[k].i,
           cases[k].what, cases[k].want == 0 ? "goes through" : "refused");
}

/* A response list of `count` (as written) and then n responses of the
 * smallest encoding, kind `kind`, through the decoder: its result, its
 * message in msg, its count in *got. */
static hvd_result_t list_trip(int32_t count, int n, int32_t kind, size_t cut,
                              char *msg, size_t cap, int *got) {
  hvd__wbuf_t w;
  hvd__response_t *out = NULL;
  memset(&w, 0, sizeof w);
  size_t last = 0;
  hvd__w_i32(&w, count);
  for (int k = 0; k < n; k++) {
    hvd__response_t x;
    memset(&x, 0, sizeof x);
    last = w.len;
    hvd__msg_put_response(&w, &x, 2);
  }
  if (n > 0) /* the last response's kind, its first field */
    memcpy(w.data + last, &kind, 4);
  *got = -7;
  hvd_result_t rc = hvd__msg_get_responses(w.data, w.len - cut, 2, &out, got);
  snprintf(msg, cap, "%s", rc == HVD_SUCCESS ? "" : hvd_last_error());
  if (rc == HVD_SUCCESS)
    hvd__responses_free(out, *got);
  hvd__w_free(&w);
  return rc;
}

/* The response lists' bounds. */
static void lists(void) {
  char msg[HVD__ERRMSG_MAX];
  const char *bad = "malformed response list";
  int n;
  hvd_result_t rc = list_trip(3, 3, HVD__RESP_STALL, 0, msg, sizeof msg, &n);
  ok(rc == HVD_SUCCESS && n == 3,
     "three responses of the smallest encoding go through (%s, %d)", msg, n);
  rc = list_trip(0, 0, 0, 0, msg, sizeof msg, &n);
  ok(rc == HVD_SUCCESS && n == 0, "an empty list goes through (%s)", msg);
  static const struct {
    int32_t count;
    int n;
    int32_t kind;
    size_t cut;
    const char *what;
  } cases[] = {
      {-1, 0, 0, 0, "a count of -1"},
      {INT32_MIN, 1, 0, 0, "the most negative count"},
      {INT32_MAX, 1, 0, 0, "a count past the bytes (INT32_MAX)"},
      {4, 3, 0, 0, "a count one past the responses"},
      {1, 1, HVD__RESP_KIND_COUNT, 0, "a kind past the last"},
      {1, 1, -1, 0, "a negative kind"},
      {0, 0, 0, 4, "no bytes at all"},
      {1, 1, 0, 1, "a response cut short"},
  };
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    rc = list_trip(cases[k].count, cases[k].n, cases[k].kind, cases[k].cut,
                   msg, sizeof msg, &n);
    is_int(HVD_ERR_INTERNAL, rc, "%s: refused", cases[k].what);
    is_string(bad, msg, "%s: its message", cases[k].what);
  }
}

int main(void) {
  hvd__desc_t d;
  hvd_request_t *r = make();
  plan(9 + 9 + 2 + 16);
  is_int(0, round_trip(r, &d), "a request goes through");
  ok(memcmp(&d, &r->desc, sizeof d) == 0,
     "its descriptor comes back field for field");
  static const struct {
    const char *what;
    int field; /* 0 coll, 1 dtype, 2 op, 3 wire */
    int value;
  } bad[] = {
      {"a collective past the last (HVD__COLL_COUNT)", 0, HVD__COLL_COUNT},
      {"a negative collective", 0, -1},
      {"a dtype past the last (HVD_DTYPE_COUNT)", 1, HVD_DTYPE_COUNT},
      {"an op past the last (HVD_OP_COUNT)", 2, HVD_OP_COUNT},
      {"a negative op", 2, -7},
      {"a wire dtype past the last", 3, 200},
      {"a negative wire dtype", 3, -1},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    hvd_request_t *b = make();
    if (bad[i].field == 0)
      b->desc.coll = (hvd__coll_t)bad[i].value;
    else if (bad[i].field == 1)
      b->desc.dtype = (hvd_dtype_t)bad[i].value;
    else if (bad[i].field == 2)
      b->desc.op = (hvd_op_t)bad[i].value;
    else
      b->desc.wire = (hvd_dtype_t)bad[i].value;
    is_int(-1, round_trip(b, &d), "%s: refused when read", bad[i].what);
    hvd__request_free(b);
  }
  hvd__request_free(r);
  groups();
  lists();
  return tap_exit_status();
}
