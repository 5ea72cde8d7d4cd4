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
