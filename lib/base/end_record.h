/*
 * end_record.h - each rank's own account of how it ended, for hvdrun
 * (doc/hvdrun.1, "How a job ended"). When HVD_END_DIR names a directory,
 * every process that loads libhvd under a launcher that gives it a rank
 * (OMPI_COMM_WORLD_RANK, PMIX_RANK, PMI_RANK or SLURM_PROCID) keeps the
 * file DIR/rank.R, replaced whole (a rename) at each change:
 *
 *   rank 1                      the launcher's rank of this process
 *   host node2
 *   pid 4242
 *   state exited                running | stopping | exited | signal |
 *                               aborted
 *   status 3                    exited: exit's status as the parent sees
 *                               it (0-255); aborted: MPI_Abort's
 *   signal 15                   signal: its number
 *   by launcher                 signal: sent by the parent (mpirun or its
 *                               daemon: the job being stopped; through a
 *                               wrapper script, the parent of the process
 *                               group's leader, which Open MPI signals),
 *                               by pid N, or by the kernel (a fault)
 *   time 1764175000.123456      when the state first left running
 *   error <text>                hvd's fatal error, when it had one
 *
 * "running" is written when the library loads; what ends the process
 * then rewrites it: exit (on_exit: the status), a signal (handlers for
 * TERM, INT, HUP, QUIT, ABRT, SEGV, BUS, FPE and ILL, chained to what was
 * there before, installed unless the signal was ignored), or hvd's exit
 * handler before MPI_Abort. "stopping" is the launcher's SIGCONT, which
 * Open MPI sends a second before its SIGTERM: the SIGKILL that follows
 * as soon as any rank has died of the SIGTERM may cut the others short,
 * and the SIGCONT record says they were being stopped. A SIGKILL leaves
 * "running": that absence of an end is what the launcher reads as a kill (or a
 * lost host). The writes are async-signal-safe: no stdio, no allocation. A
 * process whose rank.R belongs to another live process (a child a rank started,
 * which inherits the rank and HVD_END_DIR) keeps no record.
 */
#ifndef HVD_BASE_END_RECORD_H
#define HVD_BASE_END_RECORD_H

/* hvd_init calls it once MPI is up: the exit status is recorded by a
 * handler that runs before hvd's own exit handler (which may wait for
 * peers, or abort), so that the record's time is the moment exit was
 * called. Nothing without a record. */
void hvd__end_record_init(void);

/* hvd's fatal error (hvd__fatal_set): kept in the record from now on. */
void hvd__end_record_error(const char *reason);

/* hvd's exit handler is about to end the job with MPI_Abort(code). */
void hvd__end_record_abort(int code);

#endif /* HVD_BASE_END_RECORD_H */
