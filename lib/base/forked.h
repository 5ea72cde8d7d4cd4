/* forked.h - whether this process is a child forked after hvd_init.
 *
 * A child made by fork() (a data-loader worker, a helper that never
 * execs) has a copy of hvd's memory but none of its threads: no engine,
 * no checkpoint writer; and MPI and NCCL belong to the parent. So in such
 * a child every call that would communicate or wait for those threads
 * fails (hvd__not_initialized says why), hvd_shutdown and the exit
 * handlers leave MPI alone, and hvd_alloc_host keeps off the parent's
 * arena (host_mem.c). */
#ifndef HVD_BASE_FORKED_H
#define HVD_BASE_FORKED_H

/* From hvd_init (any number of times): a fork from now on marks the child.
 * Records this process's pid as the parent's. */
void hvd__fork_watch(void);

/* 1 in a process forked (at any depth) after hvd__fork_watch; else 0. A
 * relaxed atomic load: cheap enough for every call. */
int hvd__forked(void);

/* The pid that called hvd__fork_watch (the hvd process); 0 before. */
long hvd__fork_parent(void);

#endif /* HVD_BASE_FORKED_H */
