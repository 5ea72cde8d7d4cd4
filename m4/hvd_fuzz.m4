dnl HVD_ENABLE_FUZZ: --enable-fuzz builds everything with
dnl -fsanitize=fuzzer-no-link (coverage for libFuzzer) and the fuzz targets
dnl of t/fuzz with -fsanitize=fuzzer; needs a compiler with libFuzzer
dnl (clang). `make fuzz-run` then runs each target for FUZZ_SECONDS.
AC_DEFUN([HVD_ENABLE_FUZZ], [
  AC_ARG_ENABLE([fuzz],
    [AS_HELP_STRING([--enable-fuzz],
      [build the libFuzzer targets of t/fuzz (CC=clang); make fuzz-run runs them])],
    [], [enable_fuzz=no])
  HVD_FUZZ_CFLAGS=
  AS_IF([test "x$enable_fuzz" = xyes], [
    hvd_save_CFLAGS=$CFLAGS
    CFLAGS="$CFLAGS -fsanitize=fuzzer-no-link"
    AC_MSG_CHECKING([whether $CC supports -fsanitize=fuzzer-no-link])
    AC_COMPILE_IFELSE([AC_LANG_PROGRAM([], [])], [AC_MSG_RESULT([yes])],
      [AC_MSG_RESULT([no])
       AC_MSG_ERROR([--enable-fuzz needs libFuzzer: configure with CC=clang])])
    CFLAGS=$hvd_save_CFLAGS
    HVD_FUZZ_CFLAGS="-fsanitize=fuzzer-no-link"])
  AC_SUBST([HVD_FUZZ_CFLAGS])
  AM_CONDITIONAL([HVD_FUZZ], [test "x$enable_fuzz" = xyes])
])
