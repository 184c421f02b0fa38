/*
 * json.h — just enough JSON for flashc's meta.json: a streaming writer, and a reader that validates a whole
 * document and returns one top-level member of an object.
 */
#ifndef FLASHC_JSON_H
#define FLASHC_JSON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

#define JSON_MAX_DEPTH   32
#define JSON_MAX_NUMBERS 64 /* elements of an array that json_get returns */

/* Objects are written one member per line, arrays on one line. A misuse (a value where a key is due,
 * nesting deeper than JSON_MAX_DEPTH) or a write error sets `failed`; check it (or json_finish) at the end. */
typedef struct json_writer {
  FILE *f;
  int depth;
  bool is_array[JSON_MAX_DEPTH];
  bool has_items[JSON_MAX_DEPTH];
  bool after_key;
  bool failed;
} json_writer;

void json_init(json_writer *w, FILE *f);
void json_object_begin(json_writer *w);
void json_object_end(json_writer *w);
void json_array_begin(json_writer *w);
void json_array_end(json_writer *w);
void json_key(json_writer *w, const char *key);
void json_string(json_writer *w, const char *s); /* escaped; NULL writes null */
void json_int(json_writer *w, int64_t v);
void json_uint(json_writer *w, uint64_t v);
void json_double(json_writer *w, double v); /* shortest round-trip form; NaN and inf write null */
void json_bool(json_writer *w, bool v);
/* Ends the document with a newline; 0 when everything was written and balanced, -1 otherwise. */
int json_finish(json_writer *w);

typedef enum { JSON_NULL, JSON_BOOL, JSON_NUMBER, JSON_STRING, JSON_ARRAY, JSON_OBJECT } json_type;

typedef struct json_value {
  json_type type;
  bool boolean;
  double number;
  char string[256];                 /* JSON_STRING, unescaped (\u escapes above ASCII become '?'); truncated to fit */
  int64_t count;                    /* JSON_ARRAY: its elements */
  double numbers[JSON_MAX_NUMBERS]; /* JSON_ARRAY: its first elements (NaN where one is no number) */
} json_value;

/* Validates text[len] as one JSON object and finds its top-level member `key`. Returns 1 found (into
 * *out), 0 absent, -1 invalid JSON (message in err). */
int json_get(const char *text, size_t len, const char *key, json_value *out, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif
#endif /* FLASHC_JSON_H */
