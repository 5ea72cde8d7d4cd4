dnl HVD_CHECK_MPI: Open MPI is required. Flags come from pkg-config
dnl (ompi-c), else from `mpicc -showme:compile/link`; MPI_CFLAGS and
dnl MPI_LIBS are substituted, and so is MPIEXEC for the test suite.
AC_DEFUN([HVD_CHECK_MPI], [
  AC_ARG_VAR([MPICC], [MPI compiler wrapper to ask for flags (default: mpicc)])
  AC_ARG_VAR([MPIEXEC], [MPI launcher used by the tests (default: mpiexec)])
  AC_ARG_VAR([MPI_CFLAGS], [C preprocessor flags for MPI])
  AC_ARG_VAR([MPI_LIBS], [linker flags for MPI])
  AS_IF([test "x$MPI_CFLAGS$MPI_LIBS" = x], [
    PKG_CHECK_EXISTS([ompi-c], [
      MPI_CFLAGS=`$PKG_CONFIG --cflags ompi-c`
      MPI_LIBS=`$PKG_CONFIG --libs ompi-c`
      hvd_mpi_how="pkg-config ompi-c"], [
      AC_PATH_PROGS([MPICC], [mpicc], [])
      AS_IF([test "x$MPICC" != x], [
        MPI_CFLAGS=`$MPICC -showme:compile 2>/dev/null`
        MPI_LIBS=`$MPICC -showme:link 2>/dev/null`
        hvd_mpi_how="$MPICC -showme"])])], [hvd_mpi_how="MPI_CFLAGS/MPI_LIBS"])
  hvd_save_CPPFLAGS=$CPPFLAGS
  hvd_save_LIBS=$LIBS
  CPPFLAGS="$CPPFLAGS $MPI_CFLAGS"
  LIBS="$MPI_LIBS $LIBS"
  AC_MSG_CHECKING([for a working MPI ($hvd_mpi_how)])
  AC_LINK_IFELSE([AC_LANG_PROGRAM([[#include <mpi.h>]],
      [[int p; MPI_Init_thread(0, 0, MPI_THREAD_MULTIPLE, &p);
        MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0,
                            MPI_INFO_NULL, 0); return 0;]])],
    [AC_MSG_RESULT([yes])],
    [AC_MSG_RESULT([no])
     AC_MSG_ERROR([hvd needs Open MPI (MPI-3). On Debian/Ubuntu: apt-get install libopenmpi-dev openmpi-bin])])
  AC_COMPUTE_INT([hvd_ompi_major], [OMPI_MAJOR_VERSION], [#include <mpi.h>], [hvd_ompi_major=])
  AC_COMPUTE_INT([hvd_ompi_minor], [OMPI_MINOR_VERSION], [#include <mpi.h>], [hvd_ompi_minor=])
  CPPFLAGS=$hvd_save_CPPFLAGS
  LIBS=$hvd_save_LIBS
  AS_IF([test "x$hvd_ompi_major" = x],
    [AC_MSG_ERROR([hvd needs Open MPI; mpi.h does not define OMPI_MAJOR_VERSION])])
  AC_PATH_PROGS([MPIEXEC], [mpiexec mpirun], [])
  AS_IF([test "x$MPIEXEC" = x],
    [AC_MSG_ERROR([no mpiexec found; On Debian/Ubuntu: apt-get install openmpi-bin])])
  hvd_mpi_summary="Open MPI $hvd_ompi_major.$hvd_ompi_minor ($hvd_mpi_how)"
  AC_SUBST([MPI_CFLAGS])
  AC_SUBST([MPI_LIBS])
])
