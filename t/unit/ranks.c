/*
 * ranks.c - hvd__ranks (lib/base/errors.h), the list of disagreeing ranks
 * in hvd's mismatch messages (the controller's, hvd_init's settings):
 *  - none added: nothing written, 0 returned;
 *  - one, then eight: "<head> vs rank R V, ..." exactly;
 *  - eleven: eight named, ", and 3 more ranks", 11 returned;
 *  - a list longer than the message: cut at the buffer, NUL-terminated,
 *    no write past it;
 *  - begin empties a list used before;
 *  - a list of ranks alone (values NULL): "" when none, "1, 3", eight
 *    then ", and 3 more ranks", each with its count returned.
 */
#include <stdio.h>
#include <string.h>

#include "base/errors.h"
#include "tap.h"

int main(void) {
  hvd__ranks_t l;
  char out[HVD__ERRMSG_MAX], v[32];
  plan(15);

  hvd__ranks_begin(&l);
  strcpy(out, "untouched");
  is_int(0, hvd__ranks_write(&l, "head", out, sizeof out), "none: 0");
  is_string("untouched", out, "none: nothing written");

  hvd__ranks_add(&l, 2, "prescale 0.5");
  is_int(1, hvd__ranks_write(&l, "x: rank 0 prescale 1", out, sizeof out),
         "one rank: 1");
  is_string("x: rank 0 prescale 1 vs rank 2 prescale 0.5", out, "one rank");

  hvd__ranks_begin(&l);
  for (int r = 1; r <= 11; r++) {
    snprintf(v, sizeof v, "%d", 10 * r);
    hvd__ranks_add(&l, r, v);
  }
  is_int(11, hvd__ranks_write(&l, "H: rank 0 0", out, sizeof out),
         "eleven ranks: 11");
  is_string("H: rank 0 0 vs rank 1 10, rank 2 20, rank 3 30, rank 4 40, rank 5 "
         "50, rank 6 60, rank 7 70, rank 8 80, and 3 more ranks",
         out, "eleven ranks: eight named, then the count");

  char big[600], small[40];
  memset(big, 'v', sizeof big - 1);
  big[sizeof big - 1] = '\0';
  hvd__ranks_begin(&l);
  for (int r = 0; r < 8; r++)
    hvd__ranks_add(&l, r, big);
  memset(small, '#', sizeof small);
  hvd__ranks_write(&l, "head", small, 20);
  ok(strcmp(small, "head vs rank 0 vvvv") == 0 && small[20] == '#',
     "a list longer than the message is cut at the buffer ('%s')", small);
  ok(strlen(l.items) < sizeof l.items && l.listed == 8,
     "the items stay within their own buffer (%zu bytes)", strlen(l.items));

  hvd__ranks_begin(&l);
  hvd__ranks_add(&l, 5, "a");
  hvd__ranks_write(&l, "h", out, sizeof out);
  is_string("h vs rank 5 a", out, "begin empties a list used before");

  hvd__ranks_begin(&l);
  strcpy(out, "untouched");
  is_int(0, hvd__ranks_list(&l, out, sizeof out), "alone, none: 0");
  is_string("", out, "alone, none: empty");
  hvd__ranks_add(&l, 1, NULL);
  hvd__ranks_add(&l, 3, NULL);
  is_int(2, hvd__ranks_list(&l, out, sizeof out), "alone, two: 2");
  is_string("1, 3", out, "alone, two: their numbers");
  for (int r = 5; r <= 21; r += 2)
    hvd__ranks_add(&l, r, NULL);
  is_int(11, hvd__ranks_list(&l, out, sizeof out), "alone, eleven: 11");
  is_string("1, 3, 5, 7, 9, 11, 13, 15, and 3 more ranks", out,
            "alone, eleven: eight named, then the count");
  return tap_exit_status();
}
