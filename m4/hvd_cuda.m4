dnl HVD_CHECK_CUDA: optional CUDA runtime + cuBLAS.
dnl --with-cuda[=DIR] (default: guess, trying /usr/local/cuda). An explicit
dnl request that cannot be met is an error. Only the runtime (cudart) and
dnl cuBLAS are linked, never the driver library (libcuda), so a library
dnl built with CUDA still loads and runs its CPU paths without a GPU.
dnl The kernels (lib/ops/*.cu) need nvcc: without it there is no CUDA.
dnl Sets CUDA_CPPFLAGS, CUDA_LDFLAGS, CUDA_LIBS (the runtime: what libhvd
dnl links), CUBLAS_LIBS (for examples/bert alone), NVCC, HAVE_CUDA.
AC_DEFUN([HVD_CHECK_CUDA], [
  AC_ARG_WITH([cuda],
    [AS_HELP_STRING([--with-cuda@<:@=DIR@:>@],
      [build the GPU paths with the CUDA toolkit in DIR (default: guess, /usr/local/cuda)])],
    [], [with_cuda=guess])
  hvd_have_cuda=no
  hvd_cuda_summary=no
  hvd_cublas_summary=no
  CUDA_CPPFLAGS=
  CUDA_LDFLAGS=
  CUDA_LIBS=
  CUBLAS_LIBS=
  AS_CASE([$with_cuda],
    [no], [hvd_cuda_summary="no (--without-cuda)"],
    [yes|guess], [hvd_cuda_dir=/usr/local/cuda],
    [hvd_cuda_dir=$with_cuda])
  AS_IF([test "x$with_cuda" != xno], [
    AS_IF([test -d "$hvd_cuda_dir/lib64"], [hvd_cuda_libdir=$hvd_cuda_dir/lib64],
          [hvd_cuda_libdir=$hvd_cuda_dir/lib])
    hvd_save_CPPFLAGS=$CPPFLAGS
    hvd_save_LDFLAGS=$LDFLAGS
    hvd_save_LIBS=$LIBS
    CPPFLAGS="$CPPFLAGS -I$hvd_cuda_dir/include"
    LDFLAGS="$LDFLAGS -L$hvd_cuda_libdir"
    LIBS="-lcublasLt -lcublas -lcudart $LIBS"
    AC_MSG_CHECKING([for the CUDA runtime, cuBLAS and cuBLASLt in $hvd_cuda_dir])
    dnl the headers must be in DIR itself, not found elsewhere on the path
    AS_IF([test -f "$hvd_cuda_dir/include/cuda_runtime.h"], [
    AC_LINK_IFELSE([AC_LANG_PROGRAM([[#include <cuda_runtime.h>
#include <cublas_v2.h>
#include <cublasLt.h>]],
        [[int n = 0; cublasHandle_t h; cublasLtHandle_t lt;
          (void)cudaGetDeviceCount(&n); (void)cublasCreate(&h);
          (void)cublasLtCreate(&lt); return CUDART_VERSION > 0 ? 0 : 1;]])],
      [hvd_have_cuda=yes], [hvd_have_cuda=no])], [hvd_have_cuda=no])
    AC_MSG_RESULT([$hvd_have_cuda])
    AS_IF([test $hvd_have_cuda = yes], [
      AC_COMPUTE_INT([hvd_cudart_version], [CUDART_VERSION], [#include <cuda_runtime.h>], [hvd_cudart_version=0])])
    CPPFLAGS=$hvd_save_CPPFLAGS
    LDFLAGS=$hvd_save_LDFLAGS
    LIBS=$hvd_save_LIBS
    dnl the kernels (lib/ops/*.cu) need nvcc, from DIR/bin first
    hvd_cuda_missing="the CUDA runtime and cuBLAS were not found in $hvd_cuda_dir"
    AS_IF([test $hvd_have_cuda = yes], [
      AC_PATH_PROG([NVCC], [nvcc], [], [$hvd_cuda_dir/bin:$PATH])
      AS_IF([test "x$NVCC" = x], [
        hvd_have_cuda=no
        hvd_cuda_missing="nvcc was found neither in $hvd_cuda_dir/bin nor on PATH"])])
    AS_IF([test $hvd_have_cuda = yes], [
      CUDA_CPPFLAGS="-isystem $hvd_cuda_dir/include"
      CUDA_LDFLAGS="-L$hvd_cuda_libdir -Wl,-rpath,$hvd_cuda_libdir"
      dnl -lstdc++: the host side of nvcc's objects is C++ (kernel launch
      dnl stubs keep thread-safe statics), and libhvd is linked by $CC
      CUDA_LIBS="-lcudart -lstdc++"
      dnl cuBLAS and cuBLASLt: only examples/bert links them (libhvd calls
      dnl none of it)
      CUBLAS_LIBS="-lcublasLt -lcublas"
      hvd_cuda_summary="yes, CUDA runtime $hvd_cudart_version ($hvd_cuda_dir), $NVCC"
      hvd_cublas_summary=yes
      AC_DEFINE([HVD_HAVE_CUDA], [1], [Define to 1 to build the CUDA paths.])
    ], [
      AS_IF([test "x$with_cuda" != xguess],
        [AC_MSG_ERROR([--with-cuda was given, but $hvd_cuda_missing])])
      hvd_cuda_summary="no ($hvd_cuda_missing)"])
  ])
  AM_CONDITIONAL([HAVE_CUDA], [test $hvd_have_cuda = yes])
  AC_SUBST([CUDA_CPPFLAGS])
  AC_SUBST([CUDA_LDFLAGS])
  AC_SUBST([CUDA_LIBS])
  AC_SUBST([CUBLAS_LIBS])
  AC_SUBST([NVCC])
  AC_ARG_VAR([NVCC], [the CUDA compiler (default: DIR/bin/nvcc of --with-cuda)])
  AC_ARG_VAR([NVCCFLAGS], [more options for nvcc (after hvd's -gencode list)])
])

dnl HVD_CHECK_NCCL: optional NCCL, probed only when CUDA was found.
dnl --with-nccl[=DIR] (default: guess, in the CUDA directory). Sets
dnl NCCL_CPPFLAGS, NCCL_LDFLAGS, NCCL_LIBS, HAVE_NCCL.
AC_DEFUN([HVD_CHECK_NCCL], [
  AC_ARG_WITH([nccl],
    [AS_HELP_STRING([--with-nccl@<:@=DIR@:>@],
      [use NCCL in DIR for device tensors (default: guess, next to CUDA); needs CUDA])],
    [], [with_nccl=guess])
  hvd_have_nccl=no
  hvd_nccl_summary=no
  NCCL_CPPFLAGS=
  NCCL_LDFLAGS=
  NCCL_LIBS=
  AS_IF([test "x$with_nccl" = xno], [hvd_nccl_summary="no (--without-nccl)"],
    [test $hvd_have_cuda != yes], [
      AS_IF([test "x$with_nccl" != xguess],
        [AC_MSG_ERROR([--with-nccl was given, but NCCL needs CUDA, which was not found])])
      hvd_nccl_summary="no (no CUDA)"], [
    AS_CASE([$with_nccl], [yes|guess], [hvd_nccl_dir=$hvd_cuda_dir], [hvd_nccl_dir=$with_nccl])
    AS_IF([test -d "$hvd_nccl_dir/lib64"], [hvd_nccl_libdir=$hvd_nccl_dir/lib64],
          [hvd_nccl_libdir=$hvd_nccl_dir/lib])
    hvd_save_CPPFLAGS=$CPPFLAGS
    hvd_save_LDFLAGS=$LDFLAGS
    hvd_save_LIBS=$LIBS
    CPPFLAGS="$CPPFLAGS $CUDA_CPPFLAGS -I$hvd_nccl_dir/include"
    LDFLAGS="$LDFLAGS -L$hvd_nccl_libdir $CUDA_LDFLAGS"
    LIBS="-lnccl $CUDA_LIBS $LIBS"
    AC_MSG_CHECKING([for NCCL in $hvd_nccl_dir])
    AS_IF([test -f "$hvd_nccl_dir/include/nccl.h"], [
    AC_LINK_IFELSE([AC_LANG_PROGRAM([[#include <nccl.h>]],
        [[int v = 0; ncclUniqueId id; (void)ncclGetVersion(&v);
          (void)ncclGetUniqueId(&id); return NCCL_VERSION_CODE > 0 ? 0 : 1;]])],
      [hvd_have_nccl=yes], [hvd_have_nccl=no])], [hvd_have_nccl=no])
    AC_MSG_RESULT([$hvd_have_nccl])
    AS_IF([test $hvd_have_nccl = yes], [
      AC_COMPUTE_INT([hvd_nccl_version], [NCCL_VERSION_CODE], [#include <nccl.h>], [hvd_nccl_version=0])])
    CPPFLAGS=$hvd_save_CPPFLAGS
    LDFLAGS=$hvd_save_LDFLAGS
    LIBS=$hvd_save_LIBS
    AS_IF([test $hvd_have_nccl = yes], [
      AS_IF([test "x$hvd_nccl_dir" != "x$hvd_cuda_dir"], [
        NCCL_CPPFLAGS="-isystem $hvd_nccl_dir/include"
        NCCL_LDFLAGS="-L$hvd_nccl_libdir -Wl,-rpath,$hvd_nccl_libdir"])
      NCCL_LIBS="-lnccl"
      hvd_nccl_summary="yes, NCCL $hvd_nccl_version ($hvd_nccl_dir)"
      AC_DEFINE([HVD_HAVE_NCCL], [1], [Define to 1 to use NCCL for device tensors.])
    ], [
      AS_IF([test "x$with_nccl" != xguess],
        [AC_MSG_ERROR([--with-nccl was given, but NCCL was not found in $hvd_nccl_dir])])
      hvd_nccl_summary="no (not found in $hvd_nccl_dir)"])
  ])
  AM_CONDITIONAL([HAVE_NCCL], [test $hvd_have_nccl = yes])
  AC_SUBST([NCCL_CPPFLAGS])
  AC_SUBST([NCCL_LDFLAGS])
  AC_SUBST([NCCL_LIBS])
])
