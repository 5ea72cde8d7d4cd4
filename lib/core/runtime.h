/*
 * runtime.h - process-wide state: MPI ownership, hvd's communicators,
 * topology, settings and the engine.
 */
#ifndef HVD_CORE_RUNTIME_H
#define HVD_CORE_RUNTIME_H

#include "core/api.h"
#include "core/engine.h"

/* The running engine, or NULL before hvd_init / after hvd_shutdown. */
hvd__engine_t *hvd__runtime_engine(void);

/* Hands r to the engine (see hvd__engine_submit) unless hvd is not
 * initialised (then "<fn>: hvd_init() has not been called"). Safe against
 * a concurrent hvd_shutdown. On failure the caller still owns r. */
hvd_result_t hvd__runtime_submit(const char *fn, hvd_request_t *r);
/* The same for n requests, all or none (hvd__engine_submit_many). */
hvd_result_t hvd__runtime_submit_many(const char *fn, hvd_request_t *const *rs,
                                      int n);
/* The same into process set ps's engine; HVD_ERR_INVALID_ARG "<kind>
 * '<name>': rank 3 is not in process set 1 (ranks 0, 1)" on a rank
 * outside it, or after hvd_shutdown stopped it. */
hvd_result_t hvd__runtime_submit_set(const char *fn, const char *kind,
                                     const char *name,
                                     const hvd_process_set_t *ps,
                                     hvd_request_t *const *rs, int n);
/* The same checks alone (calls made of several collectives check first,
 * so that the error names the call, not an inner collective). */
hvd_result_t hvd__runtime_set_check(const char *fn, const char *kind,
                                    const char *name,
                                    const hvd_process_set_t *ps);

#endif /* HVD_CORE_RUNTIME_H */
