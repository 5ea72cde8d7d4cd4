dnl HVD_CHECK_BLAS: an optional CBLAS for the BERT model of
dnl examples/bert_train (examples/bert/), kept out of LIBS: only what links
dnl examples/bert/libbert.a uses BLAS_LIBS. --with-blas (default: guess)
dnl takes the first of -lopenblas -lblas -lcblas with cblas_sgemm and
dnl cblas.h (or BLAS_LIBS as given); --without-blas, or none found, builds
dnl hvd without examples/bert_train and its tests (they skip), and says so.
dnl An explicit --with-blas that cannot be met is an error.
dnl Sets BLAS_LIBS, HAVE_BLAS (conditional), HVD_HAVE_BLAS (config.h).
AC_DEFUN([HVD_CHECK_BLAS], [
  AC_ARG_WITH([blas],
    [AS_HELP_STRING([--without-blas],
      [build without a CBLAS, so without examples/bert_train (default: use one if found)])],
    [], [with_blas=guess])
  AC_ARG_VAR([BLAS_LIBS], [linker flags for a CBLAS (default: the first of -lopenblas -lblas -lcblas that has cblas_sgemm)])
  hvd_have_blas=no
  hvd_blas_summary="no (--without-blas): examples/bert_train is not built"
  AS_IF([test "x$with_blas" != xno], [
    hvd_save_LIBS=$LIBS
    LIBS=$BLAS_LIBS
    AC_SEARCH_LIBS([cblas_sgemm], [openblas blas cblas], [hvd_have_blas=yes])
    AS_IF([test $hvd_have_blas = yes],
      [AC_CHECK_HEADER([cblas.h], [], [hvd_have_blas=no])])
    AS_IF([test $hvd_have_blas = yes],
      [AC_CHECK_FUNCS([openblas_set_num_threads])
       BLAS_LIBS=$LIBS
       hvd_blas_summary="${BLAS_LIBS:-none needed}"
       AC_DEFINE([HVD_HAVE_BLAS], [1],
         [Define to 1 when a CBLAS builds examples/bert_train.])],
      [BLAS_LIBS=
       AS_IF([test "x$with_blas" = xyes],
         [AC_MSG_ERROR([--with-blas was given, but no CBLAS (cblas_sgemm and cblas.h) was found (apt-get install libopenblas-dev)])])
       hvd_blas_summary="no CBLAS found: examples/bert_train is not built (apt-get install libopenblas-dev)"
       AC_MSG_WARN([no CBLAS: examples/bert_train and its tests are not built (apt-get install libopenblas-dev)])])
    LIBS=$hvd_save_LIBS
  ])
  AC_SUBST([BLAS_LIBS])
  AM_CONDITIONAL([HAVE_BLAS], [test $hvd_have_blas = yes])
])
