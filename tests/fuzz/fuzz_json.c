/*
 * fuzz_json.c — libFuzzer target for the meta.json reader (src/io/json.c, json_get).
 *
 * Beyond "no crash, no UB, no leak" (ASan/UBSan), it checks what a lookup promises: the document is validated
 * whole, so every key gets the same verdict (invalid for all, or found/absent for each); an invalid document says
 * why; a found value is one of the types, its string NUL-terminated in its buffer, an array's count not negative;
 * and a number written by json_writer and read back is the same double.
 *   cmake -B build-fuzz -DFLASHC_FUZZ=ON -DCMAKE_C_COMPILER=clang && cmake --build build-fuzz -t fuzz_json
 *   build-fuzz/tests/fuzz_json -max_total_time=60 tests/fuzz/corpus/json
 */
#include "json.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char *const keys[] = {"dtype", "seed", "varlen_q", "shapes", "", "a"};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  int verdict = 2; /* -1 invalid, else valid (found or absent) */
  for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++) {
    json_value v;
    char err[256] = "";
    const int r = json_get((const char *)data, size, keys[k], &v, err, sizeof err);
    if (r < -1 || r > 1) abort();
    if (r == -1 && err[0] == '\0') abort();                    /* an invalid document says why */
    if (verdict != 2 && (r == -1) != (verdict == -1)) abort(); /* one verdict for the whole document */
    verdict = r == -1 ? -1 : 0;
    if (r != 1) continue;
    if (v.type < JSON_NULL || v.type > JSON_OBJECT) abort();
    if (memchr(v.string, '\0', sizeof v.string) == NULL) abort();
    if (v.type == JSON_ARRAY && v.count < 0) abort();
    if (v.type == JSON_NUMBER && isfinite(v.number)) { /* the writer's shortest form reads back exactly */
      char *buf = NULL;
      size_t len = 0;
      FILE *f = open_memstream(&buf, &len);
      if (!f) abort();
      json_writer w;
      json_init(&w, f);
      json_object_begin(&w);
      json_key(&w, "x");
      json_double(&w, v.number);
      json_object_end(&w);
      if (json_finish(&w) != 0) abort();
      fclose(f);
      json_value back;
      if (json_get(buf, len, "x", &back, err, sizeof err) != 1 || back.type != JSON_NUMBER ||
          memcmp(&back.number, &v.number, sizeof v.number) != 0)
        abort();
      free(buf);
    }
  }
  return 0;
}
