/*
 * message.c - the negotiation's wire codec (lib/core/message.c): a
 * request's descriptor goes through unchanged, and one whose collective,
 * dtype, op or wire dtype is out of range (a peer's bad byte, another
 * build) is refused when read, so that no table is indexed with it.
 * Linked against libhvd.a (the codec is not exported). One process.
 */
#include <stdlib.h>
#include <string.h>

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

int main(void) {
  hvd__desc_t d;
  hvd_request_t *r = make();
  plan(9);
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
  return tap_exit_status();
}
