/*
 * host_only.h - included by config.h in a host-only build of libhvd's C
 * sources (HVD_HOST_ONLY: t/mpi/local.mk's libhvd-faults.la): the CUDA
 * and NCCL paths left out, as in a build without them.
 */
#ifndef HVD_BASE_HOST_ONLY_H
#define HVD_BASE_HOST_ONLY_H

#undef HVD_HAVE_CUDA
#undef HVD_HAVE_NCCL

#endif /* HVD_BASE_HOST_ONLY_H */
