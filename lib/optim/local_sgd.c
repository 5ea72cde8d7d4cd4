/*
 * local_sgd.c - post-local SGD's periodic model average (include/hvd.h,
 * hvd_local_sgd_options_t; DDP's PeriodicModelAverager): every parameter
 * of a distributed optimizer's core averaged over all ranks, after the
 * update of a local step whose count the period picks (distributed.c
 * decides when, and routes the local steps' gradients to the group).
 *
 * Each parameter is one HVD_AVERAGE allreduce in place, "hvd.lsgd.<name>",
 * all submitted, then all waited for: the engine fuses them as it fuses
 * gradients. A mixed-precision parameter's float32 master is averaged,
 * and its value rounded from it afterwards, so that masters stay the
 * truth. Device values (or masters) are updated on the optimizer's
 * stream, so their allreduces are submitted with it as the thread's hvd
 * stream: ordered after the update on the device, the host waiting for
 * nothing until hvd_wait.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/errors.h"
#include "base/tensor.h"
#include "optim/device.h"
#include "optim/optimizer.h"

#define LSGD_PREFIX "hvd.lsgd."

static const char who[] = "hvd_optimizer_step";

/* Parameter i's average submitted: its master when it has one. */
static hvd_result_t submit(hvd_optimizer_t *core, int i, hvd_request_t **req) {
  const hvd_param_t *p = &core->params[i];
  hvd_tensor_t *m = core->mixed != NULL ? hvd__mixed_master(core, i) : NULL;
  hvd_tensor_t t = m != NULL ? *m : p->value;
  size_t len = sizeof LSGD_PREFIX + strlen(p->name);
  char *name = malloc(len);
  if (name == NULL)
    return hvd__set_error(HVD_ERR_NO_MEMORY, "%s: out of memory", who);
  snprintf(name, len, "%s%s", LSGD_PREFIX, p->name);
  hvd_result_t rc = hvd__odev_allreduce_async(core->odev, name, &t, HVD_AVERAGE,
                                              t.dtype, req);
  free(name);
  return rc;
}

hvd_result_t hvd__lsgd_average(hvd_optimizer_t *core) {
  hvd_result_t first = HVD_SUCCESS;
  char msg[HVD__ERRMSG_MAX] = "";
  hvd_request_t **reqs =
      calloc(core->n > 0 ? (size_t)core->n : 1, sizeof *reqs);
  if (reqs == NULL)
    return hvd__set_error(HVD_ERR_NO_MEMORY, "%s: out of memory", who);
  for (int i = 0; i < core->n && first == HVD_SUCCESS; i++)
    if ((first = submit(core, i, &reqs[i])) != HVD_SUCCESS)
      snprintf(msg, sizeof msg, "%s", hvd_last_error());
  for (int i = 0; i < core->n; i++) { /* every one submitted, even so */
    if (reqs[i] == NULL)
      continue;
    hvd_result_t rc = hvd_wait(reqs[i]);
    if (rc != HVD_SUCCESS && first == HVD_SUCCESS) {
      first = rc;
      snprintf(msg, sizeof msg, "%s", hvd_last_error());
    }
  }
  free(reqs);
  if (first == HVD_SUCCESS && core->mixed != NULL)
    first = hvd__mixed_values_from_masters(core);
  if (first == HVD_SUCCESS && core->odev != NULL)
    first = hvd__odev_sync(who, core->odev);
  else if (first != HVD_SUCCESS && msg[0] != '\0')
    first = hvd__set_error_msg(first, msg);
  return first;
}
