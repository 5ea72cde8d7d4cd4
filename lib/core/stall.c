/*
 * stall.c - the stall inspector (stall.h).
 */
#include "core/stall.h"

#include <stdio.h>

#include "base/errors.h"
#include "base/log.h"
#include "core/message.h"

int hvd__stall_due(const hvd__stall_t *s, int npending) {
  return npending > 0 && (s->check_s > 0 || s->shutdown_s > 0) &&
         hvd__now() >= s->next_check;
}

/* "1, 3" for the ranks r with want == (have[r] || joined[r]), named by
 * their world ranks: eight, then ", and N more ranks" ("" when none). */
static void rank_list(const hvd__pending_t *p, const unsigned char *joined,
                      int size, int want, const int *world, char *buf,
                      size_t n) {
  hvd__ranks_t l;
  hvd__ranks_begin(&l);
  for (int r = 0; r < size; r++)
    if ((p->have[r] || joined[r]) == want)
      hvd__ranks_add(&l, world != NULL ? world[r] : r, NULL);
  hvd__ranks_list(&l, buf, n);
}

int hvd__stall_inspect(hvd__stall_t *s, hvd__pending_t *head,
                       const unsigned char *joined, int size, hvd__wbuf_t *w) {
  double now = hvd__now();
  s->next_check = now + 0.1;
  for (hvd__pending_t *p = head; p != NULL; p = p->next) {
    double age = now - p->first_seen;
    int check = s->check_s > 0 && age >= s->check_s && !p->warned;
    int stop = s->shutdown_s > 0 && age >= s->shutdown_s;
    if (!check && !stop)
      continue;
    char lab[300], missing[256], present[256], msg[HVD__ERRMSG_MAX];
    int ref = 0;
    while (ref < size && !p->have[ref])
      ref++;
    hvd__pending_label(p, ref < size ? p->desc[ref].coll : HVD__ALLREDUCE, lab,
                       sizeof lab);
    rank_list(p, joined, size, 0, s->world, missing, sizeof missing);
    if (missing[0] == '\0') /* a group's member, waiting for another */
      continue;
    rank_list(p, joined, size, 1, s->world, present, sizeof present);
    if (check) {
      HVD__LOG(HVD__LOG_WARNING,
               "stall: %s has waited %.1f s for rank(s) %s; submitted by "
               "rank(s) %s",
               lab, age, missing, present);
      p->warned = 1;
    }
    if (stop) {
      snprintf(msg, sizeof msg,
               "%s stalled for %.1f s: rank(s) %s never submitted it "
               "(HVD_STALL_SHUTDOWN_TIME=%g)",
               lab, age, missing, s->shutdown_s);
      hvd__response_t x = {.kind = HVD__RESP_STALL, .errmsg = msg};
      x.desc.coll = HVD__ALLREDUCE;
      hvd__msg_put_response(w, &x, size);
      return 1;
    }
  }
  return 0;
}
