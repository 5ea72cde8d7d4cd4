/*
 * stall.c - lib/core/stall.c's inspector on a pending allreduce of a
 * world of 200 ranks that the even ranks submitted 10 s ago (check 5 s,
 * shutdown 8 s): its warning (stderr, read back from a file) and its
 * STALL response name eight ranks of each list, then ", and 92 more
 * ranks" (before: each list was cut silently at 512 bytes, mid-list);
 * with the ranks of a process set (world ranks 1000 + r) the same with
 * those numbers; with 3 ranks, every rank named as before. The age ("10.0"
 * here) is read from the message, not compared. One process; linked
 * statically (the inspector is not exported).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/errors.h"
#include "base/wait.h"
#include "core/message.h"
#include "core/stall.h"
#include "hvdtest.h"
#include "tap.h"

enum { MAXR = 200 };

/* s with each number right after "for " or "waited " (the age) as "S". */
static void unage(const char *s, char *out, size_t cap) {
  size_t o = 0;
  for (size_t i = 0; s[i] != '\0' && o + 2 < cap;) {
    int age = (i >= 4 && strncmp(s + i - 4, "for ", 4) == 0) ||
              (i >= 7 && strncmp(s + i - 7, "waited ", 7) == 0);
    if (age && s[i] >= '0' && s[i] <= '9') {
      while ((s[i] >= '0' && s[i] <= '9') || s[i] == '.')
        i++;
      out[o++] = 'S';
    } else {
      out[o++] = s[i++];
    }
  }
  out[o] = '\0';
}

/* The inspector on `size` ranks, the even ones having submitted: its
 * STALL message into msg and its warning (stderr) into warn, both with
 * the age as "S". */
static void inspect(int size, const int *world, char *msg, char *warn,
                    size_t cap) {
  static hvd__desc_t desc[MAXR];
  static double ready[MAXR];
  static unsigned char have[MAXR], joined[MAXR];
  char got[4096];
  hvd__pending_t p;
  memset(&p, 0, sizeof p);
  p.name = "layer.weight";
  p.desc = desc, p.ready = ready, p.have = have;
  for (int r = 0; r < size; r++) {
    have[r] = r % 2 == 0;
    p.count += have[r];
    desc[r].coll = HVD__ALLREDUCE;
  }
  p.first_seen = hvd__now() - 10;
  hvd__stall_t s = {5, 8, 0, world};
  hvd__wbuf_t w;
  memset(&w, 0, sizeof w);
  hvd__w_i32(&w, 1);
  int saved = hvdt_stderr_begin();
  int n = hvd__stall_inspect(&s, &p, joined, size, &w);
  hvdt_stderr_end(saved, got, sizeof got);
  unage(got, warn, cap);
  msg[0] = '\0';
  hvd__response_t *out = NULL;
  int nout = 0;
  if (n == 1 &&
      hvd__msg_get_responses(w.data, w.len, size, &out, &nout) == HVD_SUCCESS &&
      nout == 1)
    unage(out[0].errmsg, msg, cap);
  hvd__responses_free(out, nout);
  hvd__w_free(&w);
}

static void check(int size, const int *world, const char *missing,
                  const char *present, const char *what) {
  char msg[HVD__ERRMSG_MAX], warn[HVD__ERRMSG_MAX], want[HVD__ERRMSG_MAX];
  inspect(size, world, msg, warn, sizeof msg);
  snprintf(want, sizeof want,
           "allreduce 'layer.weight' stalled for S s: rank(s) %s never "
           "submitted it (HVD_STALL_SHUTDOWN_TIME=8)",
           missing);
  is_string(want, msg, "%s: the STALL response", what);
  snprintf(want, sizeof want,
           "warning: stall: allreduce 'layer.weight' has waited S s for "
           "rank(s) %s; submitted by rank(s) %s\n",
           missing, present);
  const char *at = strstr(warn, "warning: ");
  is_string(want, at != NULL ? at : warn, "%s: the warning", what);
}

int main(void) {
  static int world[MAXR];
  plan(6);
  check(200, NULL, "1, 3, 5, 7, 9, 11, 13, 15, and 92 more ranks",
        "0, 2, 4, 6, 8, 10, 12, 14, and 92 more ranks", "200 ranks");
  for (int r = 0; r < MAXR; r++)
    world[r] = 1000 + r;
  check(200, world,
        "1001, 1003, 1005, 1007, 1009, 1011, 1013, 1015, and 92 more ranks",
        "1000, 1002, 1004, 1006, 1008, 1010, 1012, 1014, and 92 more ranks",
        "a set's 200 ranks");
  check(3, NULL, "1", "0, 2", "3 ranks");
  return tap_exit_status();
}
