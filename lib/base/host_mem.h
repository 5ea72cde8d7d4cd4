/*
 * host_mem.h - what the executors need of hvd_alloc_host's arena
 * (host_mem.c): the memfd its blocks live in, so that the ranks of a node
 * can map each other's read-write, and read tensors and write results in
 * place.
 */
#ifndef HVD_BASE_HOST_MEM_H
#define HVD_BASE_HOST_MEM_H

#include <stdint.h>

/* Bytes of address space (and of the sparse file) per process: the most
 * hvd_alloc_host memory that peers can reach in place; blocks beyond it
 * are private memory, reduced through the shared segment's slots. */
#define HVD__ARENA_SIZE ((uint64_t)256 << 30)

/* This process's arena, made now if it was not: its memfd, its base
 * address and size. 0 when there is none (HVD_HOST_ARENA=0, or the
 * system refused); then every block is private. Thread-safe. */
int hvd__host_arena(int *fd, char **base, uint64_t *size);

#endif /* HVD_BASE_HOST_MEM_H */
