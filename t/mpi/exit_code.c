/*
 * exit_code.c - the program of hvdrun.sh's failure summary: a plain MPI
 * program (no hvd) whose rank 1 exits with status 3 right after MPI_Init
 * while the others wait in a barrier that never completes, so that rank 1
 * is always the first to fail and mpirun stops the others.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
  int rank;
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank == 1) {
    fprintf(stderr, "exit_code: rank 1 exits with status 3\n");
    exit(3);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  MPI_Finalize();
  return 0;
}
