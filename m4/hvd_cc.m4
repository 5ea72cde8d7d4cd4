dnl HVD_PROG_C11: make sure $CC compiles C11 (_Thread_local, _Static_assert),
dnl adding -std=gnu11 when the default dialect is older.
AC_DEFUN([HVD_PROG_C11], [
  AC_CACHE_CHECK([for C11 flags], [hvd_cv_c11_flags], [
    hvd_cv_c11_flags=unsupported
    hvd_save_CFLAGS=$CFLAGS
    for hvd_flag in "" -std=gnu11 -std=c11; do
      CFLAGS="$hvd_save_CFLAGS $hvd_flag"
      AC_COMPILE_IFELSE([AC_LANG_PROGRAM([[
        _Static_assert(sizeof(int) >= 2, "int");
        static _Thread_local int x;]], [[return x;]])],
        [hvd_cv_c11_flags=$hvd_flag; break])
    done
    CFLAGS=$hvd_save_CFLAGS])
  AS_IF([test "x$hvd_cv_c11_flags" = xunsupported],
    [AC_MSG_ERROR([hvd needs a C11 compiler (_Thread_local, _Static_assert)])])
  CFLAGS="$CFLAGS $hvd_cv_c11_flags"
])

dnl HVD_CHECK_PTHREADS: POSIX threads, into PTHREAD_CFLAGS / PTHREAD_LIBS.
AC_DEFUN([HVD_CHECK_PTHREADS], [
  PTHREAD_CFLAGS=-pthread
  hvd_save_CFLAGS=$CFLAGS
  hvd_save_LIBS=$LIBS
  CFLAGS="$CFLAGS $PTHREAD_CFLAGS"
  AC_SEARCH_LIBS([pthread_create], [pthread], [],
    [AC_MSG_ERROR([hvd needs POSIX threads])])
  PTHREAD_LIBS=$LIBS
  AS_IF([test "x$PTHREAD_LIBS" = "x$hvd_save_LIBS"], [PTHREAD_LIBS=], [PTHREAD_LIBS="-lpthread"])
  CFLAGS=$hvd_save_CFLAGS
  LIBS=$hvd_save_LIBS
  AC_SUBST([PTHREAD_CFLAGS])
  AC_SUBST([PTHREAD_LIBS])
])
