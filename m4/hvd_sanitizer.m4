dnl HVD_ENABLE_SANITIZER: --enable-sanitizer=address|undefined|thread adds
dnl the flags to CFLAGS and LDFLAGS of everything built here.
AC_DEFUN([HVD_ENABLE_SANITIZER], [
  AC_ARG_ENABLE([sanitizer],
    [AS_HELP_STRING([--enable-sanitizer=KIND],
      [build with a sanitizer: address, undefined, address,undefined or thread])],
    [], [enable_sanitizer=no])
  AS_CASE([$enable_sanitizer],
    [no], [hvd_sanitizer_summary=no],
    [address|undefined|thread|address,undefined|undefined,address], [
      hvd_san_flags="-fsanitize=$enable_sanitizer -fno-omit-frame-pointer -g"
      AS_CASE([$enable_sanitizer], [*undefined*],
        [hvd_san_flags="$hvd_san_flags -fno-sanitize-recover=undefined"])
      hvd_save_CFLAGS=$CFLAGS
      hvd_save_LDFLAGS=$LDFLAGS
      CFLAGS="$CFLAGS $hvd_san_flags"
      LDFLAGS="$LDFLAGS $hvd_san_flags"
      AC_MSG_CHECKING([whether $CC supports -fsanitize=$enable_sanitizer])
      AC_LINK_IFELSE([AC_LANG_PROGRAM([], [])], [AC_MSG_RESULT([yes])],
        [AC_MSG_RESULT([no])
         AC_MSG_ERROR([$CC cannot build with -fsanitize=$enable_sanitizer])])
      CFLAGS=$hvd_save_CFLAGS
      LDFLAGS=$hvd_save_LDFLAGS
      HVD_SANITIZER_CFLAGS=$hvd_san_flags
      hvd_sanitizer_summary=$enable_sanitizer],
    [AC_MSG_ERROR([--enable-sanitizer takes address, undefined or thread, not '$enable_sanitizer'])])
  AC_SUBST([HVD_SANITIZER_CFLAGS])
])

dnl HVD_ENABLE_COVERAGE: --enable-coverage compiles everything built here
dnl with gcov's arc profiling (HVD_COVERAGE_CFLAGS, in AM_CFLAGS, given as
dnl -f options so build-aux/nvcc-wrapper hands them to nvcc's host
dnl compiler) and links it with --coverage; `make coverage` after `make
dnl check` reports (build-aux/coverage-report). Best with CFLAGS='-g -O0'.
AC_DEFUN([HVD_ENABLE_COVERAGE], [
  AC_ARG_ENABLE([coverage],
    [AS_HELP_STRING([--enable-coverage],
      [build for gcov: make check, then make coverage reports the lines of
       lib/ that the tests ran])],
    [], [enable_coverage=no])
  HVD_COVERAGE_CFLAGS=
  HVD_COVERAGE_LDFLAGS=
  AS_IF([test "x$enable_coverage" = xyes], [
    hvd_save_CFLAGS=$CFLAGS
    hvd_save_LDFLAGS=$LDFLAGS
    CFLAGS="$CFLAGS -fprofile-arcs -ftest-coverage"
    LDFLAGS="$LDFLAGS --coverage"
    AC_MSG_CHECKING([whether $CC builds for gcov])
    AC_LINK_IFELSE([AC_LANG_PROGRAM([], [])], [AC_MSG_RESULT([yes])],
      [AC_MSG_RESULT([no])
       AC_MSG_ERROR([$CC cannot build with -fprofile-arcs -ftest-coverage])])
    CFLAGS=$hvd_save_CFLAGS
    LDFLAGS=$hvd_save_LDFLAGS
    AC_PATH_PROG([GCOV], [gcov])
    AS_IF([test -z "$GCOV"], [AC_MSG_ERROR([--enable-coverage needs gcov])])
    AC_PATH_PROG([PYTHON3], [python3])
    AS_IF([test -z "$PYTHON3"],
      [AC_MSG_ERROR([--enable-coverage needs python3 (build-aux/coverage-report)])])
    HVD_COVERAGE_CFLAGS="-fprofile-arcs -ftest-coverage"
    HVD_COVERAGE_LDFLAGS=--coverage],
    [test "x$enable_coverage" != xno],
    [AC_MSG_ERROR([--enable-coverage takes no value, not '$enable_coverage'])])
  AC_SUBST([HVD_COVERAGE_CFLAGS])
  AC_SUBST([HVD_COVERAGE_LDFLAGS])
  AM_CONDITIONAL([HVD_COVERAGE], [test "x$enable_coverage" = xyes])
])
