/*
 * fuzz_npy.c — libFuzzer target for the in-memory .npy parser.
 *
 * Beyond "no crash, no UB, no leak" (ASan/UBSan), it checks what a parse promises: an error comes with a
 * message; a success has a consistent shape and element count, and re-encoding it and parsing again gives
 * back the same array bit for bit.
 *   cmake -B build-fuzz -DFLASHC_FUZZ=ON -DCMAKE_C_COMPILER=clang && cmake --build build-fuzz -t fuzz_npy
 *   build-fuzz/tests/fuzz_npy -max_total_time=60 tests/fuzz/corpus/npy
 */
#include "npy.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  npy_array a;
  char err[512] = "";
  if (npy_parse(data, size, &a, err, sizeof err) != 0) {
    if (err[0] == '\0' || a.data != NULL) abort(); /* a failure says why and holds no memory */
    return 0;
  }
  if (a.ndim < 0 || a.ndim > NPY_MAX_DIMS || !a.data || npy_dtype_size(a.dtype) == 0) abort();
  int64_t count = 1;
  for (int i = 0; i < a.ndim; i++) {
    if (a.shape[i] < 0) abort();
    count *= a.shape[i]; /* cannot overflow: the parser checked, and the data is really there */
  }
  size_t bytes = (size_t)count * npy_dtype_size(a.dtype);
  if (count != a.count || bytes > size) abort();

  void *enc;
  size_t enc_len;
  if (npy_encode(&a, 0, &enc, &enc_len, err, sizeof err) != 0) abort();
  npy_array b;
  if (npy_parse(enc, enc_len, &b, err, sizeof err) != 0) abort();
  if (b.dtype != a.dtype || b.ndim != a.ndim || b.count != a.count) abort();
  if (memcmp(a.shape, b.shape, sizeof a.shape) != 0 || memcmp(a.data, b.data, bytes) != 0) abort();
  char shape[256];
  npy_shape_string(a.ndim, a.shape, shape, sizeof shape);
  free(enc);
  npy_free(&b);
  npy_free(&a);
  return 0;
}
