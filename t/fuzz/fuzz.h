/*
 * fuzz.h - what t/fuzz's targets share: the libFuzzer entry point each
 * defines, and a file holding the current input (the readers under test
 * take paths, as users give them).
 */
#ifndef HVD_T_FUZZ_H
#define HVD_T_FUZZ_H

#include <stddef.h>
#include <stdint.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
/* Once, before any input (what it sets up is no input's leak). */
int LLVMFuzzerInitialize(int *argc, char ***argv);

/* The input's bytes in a file of this process (made once, rewritten each
 * time); its path. Aborts if it cannot be written. */
const char *fuzz_file(const uint8_t *data, size_t size);

#endif /* HVD_T_FUZZ_H */
