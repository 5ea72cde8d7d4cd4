/* fault.c - HVD_STANDIN_HOST_ALLOC_FAIL (fault.h): the stand-in's build of
 * libhvd only. */
#include <config.h>

#include "base/fault.h"

#include <stdlib.h>
#include <string.h>

int hvd__fault(const char *site) {
  const char *v = getenv("HVD_STANDIN_HOST_ALLOC_FAIL"),
             *me = getenv("OMPI_COMM_WORLD_RANK");
  char *end = NULL;
  if (v == NULL || *v == '\0')
    return 0;
  long r = strtol(v, &end, 10);
  return end != v && *end == ':' && strcmp(end + 1, site) == 0 &&
         r == (me != NULL ? atol(me) : 0);
}
