/*
 * bcast_params.c - hvd_broadcast_parameters from every root makes
 * deliberately different initialisations identical; hvd_verify_parameters
 * catches a difference forced afterwards, naming the parameter and the
 * ranks; ranks with different parameter lists get HVD_ERR_MISMATCH instead
 * of a stall; bad arguments are refused, on every rank when one rank's
 * are (params, or the optimizer, NULL on the last rank alone).
 */
#include <hvd.h>
#include <stdio.h>
#include <string.h>

#include "tap.h"

#define NP 3

static float wa[6], wb[4], wc[1];
static hvd_param_t params[NP + 1];

static void setup(int rank) {
  static const char *names[NP + 1] = {"enc.weight", "enc.bias", "scale",
                                      "extra"};
  static int64_t shapes[NP + 1][2] = {{2, 3}, {4, 0}, {1, 0}, {1, 0}};
  static int ndims[NP + 1] = {2, 1, 1, 1};
  float *data[NP + 1] = {wa, wb, wc, wc};
  for (int i = 0; i < 6; i++)
    wa[i] = (float)(rank * 100 + i);
  for (int i = 0; i < 4; i++)
    wb[i] = (float)(rank * 10 - i);
  wc[0] = (float)rank + 0.5f;
  for (int i = 0; i <= NP; i++) {
    params[i].name = names[i];
    params[i].value =
        hvd_tensor_make(data[i], HVD_FLOAT32, ndims[i], shapes[i]);
    params[i].grad = params[i].value;
  }
}

static int equals_root(int root) {
  for (int i = 0; i < 6; i++)
    if (wa[i] != (float)(root * 100 + i))
      return 0;
  for (int i = 0; i < 4; i++)
    if (wb[i] != (float)(root * 10 - i))
      return 0;
  return wc[0] == (float)root + 0.5f;
}

int main(int argc, char **argv) {
  tap_mpi_init(&argc, &argv);
  int rank = tap_rank(), size = tap_size();
  char want[512];

  is_int(HVD_ERR_NOT_INITIALIZED, hvd_broadcast_parameters(params, NP, 0),
         "before init: refused");
  is_string("hvd_broadcast_parameters: hvd_init() has not been called",
            hvd_last_error(), "before init: message");
  if (hvd_init() != HVD_SUCCESS)
    bail("hvd_init: %s", hvd_last_error());

  for (int root = 0; root < size; root++) {
    setup(rank);
    is_int(HVD_SUCCESS, hvd_broadcast_parameters(params, NP, root),
           "broadcast from root %d", root);
    ok(equals_root(root), "root %d: every rank holds the root's values", root);
  }
  is_int(HVD_SUCCESS, hvd_verify_parameters(params, NP), "verify: identical");

  /* a difference forced after the broadcast */
  if (size > 1) {
    if (rank == size - 1)
      wb[2] += 1.0f;
    is_int(HVD_ERR_CORRUPT, hvd_verify_parameters(params, NP),
           "forced difference: HVD_ERR_CORRUPT on every rank");
    snprintf(want, sizeof want,
             "hvd_verify_parameters: parameter 'enc.bias' is not identical "
             "on every rank: rank(s) %d differ from rank 0",
             size - 1);
    is_string(want, hvd_last_error(), "forced difference: message");
    is_int(HVD_SUCCESS, hvd_broadcast_parameters(params, NP, 0),
           "broadcast repairs it");
    is_int(HVD_SUCCESS, hvd_verify_parameters(params, NP),
           "verify after the repair");

    /* different lists: one parameter more on the last rank */
    int n = rank == size - 1 ? NP + 1 : NP;
    is_int(HVD_ERR_MISMATCH, hvd_broadcast_parameters(params, n, 0),
           "different parameter counts: HVD_ERR_MISMATCH");
    snprintf(want, sizeof want,
             "hvd_broadcast_parameters: ranks disagree on the parameter list: "
             "rank 0 has %d entries, rank %d has %d",
             NP, size - 1, NP + 1);
    is_string(want, hvd_last_error(), "different counts: message");

    /* same count, another name */
    const char *saved = params[1].name;
    if (rank == size - 1)
      params[1].name = "enc.bias2";
    is_int(HVD_ERR_MISMATCH, hvd_broadcast_parameters(params, NP, 0),
           "different names: HVD_ERR_MISMATCH");
    snprintf(want, sizeof want,
             "hvd_broadcast_parameters: ranks disagree on the parameter list: "
             "rank 0 and rank %d differ in names, shapes or types",
             size - 1);
    is_string(want, hvd_last_error(), "different names: message");
    params[1].name = saved;
  } else {
    skip(8, "needs 2 ranks");
  }

  is_int(HVD_ERR_INVALID_ARG, hvd_broadcast_parameters(params, NP, size),
         "root out of range");
  snprintf(want, sizeof want,
           "hvd_broadcast_parameters: root %d is out of range for %d ranks",
           size, size);
  is_string(want, hvd_last_error(), "root out of range: message");
  is_int(HVD_ERR_INVALID_ARG, hvd_broadcast_parameters(NULL, 2, 0),
         "NULL params");
  is_string("hvd_broadcast_parameters: params is NULL or n (2) is negative",
            hvd_last_error(), "NULL params: message");
  const char *name1 = params[1].name;
  params[1].name = "";
  is_int(HVD_ERR_INVALID_ARG, hvd_broadcast_parameters(params, NP, 0),
         "a parameter without a name");
  is_string("hvd_broadcast_parameters: parameter 1 has no name",
            hvd_last_error(), "a parameter without a name: message");
  params[1].name = name1;
  { /* one rank's bad argument fails every rank with its message (the
       others once waited in the first collective for ever) */
    int last = size - 1;
    char one[160] = "hvd_broadcast_parameters: parameter 1 has no name";
    if (last != 0)
      snprintf(one, sizeof one,
               "hvd_broadcast_parameters: parameter 1 has no name (on rank "
               "%d)",
               last);
    if (rank == last)
      params[1].name = "";
    is_int(HVD_ERR_INVALID_ARG, hvd_broadcast_parameters(params, NP, 0),
           "the last rank's parameter without a name: every rank fails");
    is_string(one, hvd_last_error(), "  with its message");
    params[1].name = name1;
    is_int(HVD_ERR_INVALID_ARG, hvd_verify_parameters(rank == last ? NULL
                                                                   : params,
                                                      NP),
           "hvd_verify_parameters, the last rank's params NULL: every rank");
    snprintf(one, sizeof one,
             "hvd_verify_parameters: params is NULL or n (%d) is "
             "negative%s",
             NP, "");
    if (last != 0)
      snprintf(one + strlen(one), sizeof one - strlen(one), " (on rank %d)",
               last);
    is_string(one, hvd_last_error(), "  with its message");
  }
  is_int(HVD_ERR_INVALID_ARG, hvd_broadcast_optimizer_state(NULL, 0),
         "optimizer state: NULL opt");
  is_string("hvd_broadcast_optimizer_state: opt is NULL", hvd_last_error(),
            "optimizer state: NULL opt: message");
  { /* the last rank's opt NULL: that rank used to return at once while
       the others waited in the arguments' agreement for ever */
    int last = size - 1;
    hvd_optimizer_t *opt = NULL;
    hvd_sgd_options_t o;
    hvd_sgd_options_init(&o);
    if (hvd_sgd_create(params, NP, &o, &opt) != HVD_SUCCESS)
      bail("hvd_sgd_create: %s", hvd_last_error());
    char one[160] = "hvd_broadcast_optimizer_state: opt is NULL";
    if (last != 0)
      snprintf(one + strlen(one), sizeof one - strlen(one), " (on rank %d)",
               last);
    is_int(HVD_ERR_INVALID_ARG,
           hvd_broadcast_optimizer_state(rank == last ? NULL : opt, 0),
           "optimizer state, the last rank's opt NULL: every rank fails");
    is_string(one, hvd_last_error(), "  with its message");
    is_int(HVD_SUCCESS, hvd_broadcast_optimizer_state(opt, 0),
           "optimizer state, then every rank's opt: works");
    hvd_optimizer_destroy(opt);
  }
  setup(rank);
  is_int(HVD_SUCCESS, hvd_broadcast_parameters(params, NP, 0),
         "and a broadcast still works");
  ok(equals_root(0), "with the right values");
  hvd_shutdown();
  return tap_mpi_finish();
}
