/*
 * hvd_mpi.h - the calls of hvd that take MPI types. Include after mpi.h.
 */
#ifndef HVD_MPI_H
#define HVD_MPI_H

#include <mpi.h>

#include "hvd.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Like hvd_init(), but over the ranks of comm (collective over comm). hvd
 * duplicates comm and never uses the caller's handle afterwards; the
 * caller keeps ownership of comm. MPI must already be initialised, at
 * MPI_THREAD_MULTIPLE (else HVD_ERR_UNSUPPORTED, as for hvd_init). */
hvd_result_t hvd_init_comm(MPI_Comm comm);

#ifdef __cplusplus
}
#endif

#endif /* HVD_MPI_H */
