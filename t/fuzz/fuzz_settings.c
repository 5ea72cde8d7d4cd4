/*
 * fuzz_settings.c - the HVD_* parsers on untrusted strings: the first
 * byte picks a setting, the rest (up to a NUL) is its value; each is
 * parsed as hvd_init would (hvd_setting_check), and the bytes are also
 * offered as a variable's name to the unknown-name report
 * (hvd_setting_unknown). Never a crash or a sanitizer report.
 */
#include "fuzz.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hvd.h"

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc, (void)argv;
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size == 0)
    return 0;
  int i = data[0] % hvd_setting_count();
  const char *name;
  if (hvd_setting_info(i, &name, NULL, NULL) != HVD_SUCCESS)
    abort();
  char value[512], var[600];
  size_t n = size - 1 < sizeof value - 1 ? size - 1 : sizeof value - 1;
  memcpy(value, data + 1, n);
  value[n] = '\0';
  setenv(name, value, 1);
  (void)hvd_setting_check(i);
  unsetenv(name);
  /* as a name: HVD_<bytes> and HOROVOD_<bytes>, letters and _ only */
  for (int k = 0; k < 2; k++) {
    size_t at = (size_t)snprintf(var, sizeof var, k ? "HOROVOD_" : "HVD_");
    for (size_t j = 0; j < n && at < 80; j++)
      if ((value[j] >= 'A' && value[j] <= 'Z') || value[j] == '_')
        var[at++] = value[j];
    var[at] = '\0';
    setenv(var, "1", 1);
    char msg[512];
    for (int q = 0; q < 8 && hvd_setting_unknown(q, msg, sizeof msg); q++)
      ;
    unsetenv(var);
  }
  return 0;
}
