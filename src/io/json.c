/*
 * json.c — the writer and the validating reader of json.h (RFC 8259 grammar, recursion bounded by
 * JSON_MAX_DEPTH).
 */
#include "json.h"

#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

/* ---- writer --------------------------------------------------------------------------------------------- */
void json_init(json_writer *w, FILE *f) {
  memset(w, 0, sizeof *w);
  w->f = f;
}

static void put(json_writer *w, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
static void put(json_writer *w, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  if (vfprintf(w->f, fmt, ap) < 0) w->failed = true;
  va_end(ap);
}

static void indent(json_writer *w) {
  put(w, "\n");
  for (int i = 0; i < w->depth; i++) put(w, "  ");
}

/* What comes before a value: nothing after a key; a comma and, in an object, a new line otherwise. */
static void before_value(json_writer *w) {
  if (w->after_key) {
    w->after_key = false;
    return;
  }
  if (w->depth == 0) return;
  if (!w->is_array[w->depth - 1]) {
    w->failed = true; /* a value in an object needs a key */
    return;
  }
  if (w->has_items[w->depth - 1]) put(w, ", ");
  w->has_items[w->depth - 1] = true;
}

static void container_open(json_writer *w, bool array) {
  before_value(w);
  if (w->depth == JSON_MAX_DEPTH) {
    w->failed = true;
    return;
  }
  put(w, array ? "[" : "{");
  w->is_array[w->depth] = array;
  w->has_items[w->depth] = false;
  w->depth++;
}

static void container_close(json_writer *w, bool array) {
  if (w->depth == 0 || w->is_array[w->depth - 1] != array || w->after_key) {
    w->failed = true;
    return;
  }
  w->depth--;
  if (!array && w->has_items[w->depth]) indent(w);
  put(w, array ? "]" : "}");
}

void json_object_begin(json_writer *w) { container_open(w, false); }
void json_object_end(json_writer *w) { container_close(w, false); }
void json_array_begin(json_writer *w) { container_open(w, true); }
void json_array_end(json_writer *w) { container_close(w, true); }

static void write_string(json_writer *w, const char *s) {
  put(w, "\"");
  for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
    switch (*p) {
    case '"': put(w, "\\\""); break;
    case '\\': put(w, "\\\\"); break;
    case '\n': put(w, "\\n"); break;
    case '\t': put(w, "\\t"); break;
    case '\r': put(w, "\\r"); break;
    default:
      if (*p < 0x20)
        put(w, "\\u%04x", *p);
      else
        put(w, "%c", *p);
    }
  }
  put(w, "\"");
}

void json_key(json_writer *w, const char *key) {
  if (w->depth == 0 || w->is_array[w->depth - 1] || w->after_key) {
    w->failed = true;
    return;
  }
  if (w->has_items[w->depth - 1]) put(w, ",");
  w->has_items[w->depth - 1] = true;
  indent(w);
  write_string(w, key);
  put(w, ": ");
  w->after_key = true;
}

void json_string(json_writer *w, const char *s) {
  before_value(w);
  if (s)
    write_string(w, s);
  else
    put(w, "null");
}

void json_int(json_writer *w, int64_t v) {
  before_value(w);
  put(w, "%lld", (long long)v);
}

void json_uint(json_writer *w, uint64_t v) {
  before_value(w);
  put(w, "%llu", (unsigned long long)v);
}

void json_double(json_writer *w, double v) {
  before_value(w);
  if (!isfinite(v)) {
    put(w, "null");
    return;
  }
  char buf[40];
  for (int prec = 15; prec <= 17; prec++) { /* the shortest that reads back as v */
    snprintf(buf, sizeof buf, "%.*g", prec, v);
    if (strtod(buf, NULL) == v) break;
  }
  put(w, "%s", buf);
}

void json_bool(json_writer *w, bool v) {
  before_value(w);
  put(w, v ? "true" : "false");
}

int json_finish(json_writer *w) {
  put(w, "\n");
  return w->failed || w->depth != 0 || w->after_key ? -1 : 0;
}

/* ---- reader --------------------------------------------------------------------------------------------- */
typedef struct {
  const char *s;
  size_t n, i;
  char *err;
  size_t errlen;
} reader;

static int bad(reader *r, const char *what) {
  if (r->err && r->errlen) {
    if (r->i < r->n)
      snprintf(r->err, r->errlen, "invalid JSON at offset %zu: %s (found '%c')", r->i, what,
               (unsigned char)r->s[r->i] >= 0x20 && (unsigned char)r->s[r->i] < 0x7f ? r->s[r->i] : '?');
    else
      snprintf(r->err, r->errlen, "invalid JSON: %s at the end of the text", what);
  }
  return -1;
}

static void ws(reader *r) {
  while (r->i < r->n && (r->s[r->i] == ' ' || r->s[r->i] == '\t' || r->s[r->i] == '\n' || r->s[r->i] == '\r')) r->i++;
}

static bool literal(reader *r, const char *word) {
  size_t len = strlen(word);
  if (r->n - r->i < len || memcmp(r->s + r->i, word, len) != 0) return false;
  r->i += len;
  return true;
}

static int hex4(reader *r, unsigned *out) {
  if (r->n - r->i < 4) return bad(r, "a \\u escape needs 4 hex digits");
  unsigned v = 0;
  for (int k = 0; k < 4; k++) {
    char c = r->s[r->i++];
    v <<= 4;
    if (c >= '0' && c <= '9')
      v |= (unsigned)(c - '0');
    else if (c >= 'a' && c <= 'f')
      v |= (unsigned)(c - 'a' + 10);
    else if (c >= 'A' && c <= 'F')
      v |= (unsigned)(c - 'A' + 10);
    else
      return bad(r, "a \\u escape needs 4 hex digits");
  }
  *out = v;
  return 0;
}

/* A string; unescaped into out[cap] (truncated) when out is not NULL. */
static int string(reader *r, char *out, size_t cap) {
  if (!(r->i < r->n && r->s[r->i] == '"')) return bad(r, "expected a string");
  r->i++;
  size_t len = 0;
  for (;;) {
    if (r->i >= r->n) return bad(r, "unterminated string");
    unsigned char c = (unsigned char)r->s[r->i++];
    if (c == '"') break;
    if (c < 0x20) return bad(r, "control character in a string");
    if (c == '\\') {
      if (r->i >= r->n) return bad(r, "unterminated escape");
      char e = r->s[r->i++];
      switch (e) {
      case '"': c = '"'; break;
      case '\\': c = '\\'; break;
      case '/': c = '/'; break;
      case 'b': c = '\b'; break;
      case 'f': c = '\f'; break;
      case 'n': c = '\n'; break;
      case 'r': c = '\r'; break;
      case 't': c = '\t'; break;
      case 'u': {
        unsigned u = 0;
        if (hex4(r, &u)) return -1;
        c = u < 0x80 ? (unsigned char)u : '?';
        break;
      }
      default: r->i--; return bad(r, "unknown escape");
      }
    }
    if (out && len + 1 < cap) out[len++] = (char)c;
  }
  if (out && cap) out[len] = '\0';
  return 0;
}

static int number(reader *r, double *out) {
  size_t start = r->i;
  if (r->i < r->n && r->s[r->i] == '-') r->i++;
  if (!(r->i < r->n && r->s[r->i] >= '0' && r->s[r->i] <= '9')) return bad(r, "expected a value");
  if (r->s[r->i] == '0')
    r->i++;
  else
    while (r->i < r->n && r->s[r->i] >= '0' && r->s[r->i] <= '9') r->i++;
  if (r->i < r->n && r->s[r->i] == '.') {
    r->i++;
    if (!(r->i < r->n && r->s[r->i] >= '0' && r->s[r->i] <= '9')) return bad(r, "expected digits after '.'");
    while (r->i < r->n && r->s[r->i] >= '0' && r->s[r->i] <= '9') r->i++;
  }
  if (r->i < r->n && (r->s[r->i] == 'e' || r->s[r->i] == 'E')) {
    r->i++;
    if (r->i < r->n && (r->s[r->i] == '+' || r->s[r->i] == '-')) r->i++;
    if (!(r->i < r->n && r->s[r->i] >= '0' && r->s[r->i] <= '9')) return bad(r, "expected exponent digits");
    while (r->i < r->n && r->s[r->i] >= '0' && r->s[r->i] <= '9') r->i++;
  }
  char buf[64];
  size_t len = r->i - start;
  if (len >= sizeof buf) len = sizeof buf - 1; /* a number this long loses nothing we need */
  memcpy(buf, r->s + start, len);
  buf[len] = '\0';
  if (out) *out = strtod(buf, NULL);
  return 0;
}

/* A value; its summary into out when not NULL. */
static int value(reader *r, int depth, json_value *out) {
  if (depth > JSON_MAX_DEPTH) return bad(r, "nesting too deep");
  ws(r);
  if (r->i >= r->n) return bad(r, "expected a value");
  char c = r->s[r->i];
  json_value dummy;
  json_value *v = out ? out : &dummy;
  memset(v, 0, sizeof *v);
  if (c == '{' || c == '[') {
    char close_ch = c == '{' ? '}' : ']';
    v->type = c == '{' ? JSON_OBJECT : JSON_ARRAY;
    r->i++;
    ws(r);
    if (r->i < r->n && r->s[r->i] == close_ch) {
      r->i++;
      return 0;
    }
    for (;;) {
      if (c == '{') {
        ws(r);
        if (string(r, NULL, 0)) return -1;
        ws(r);
        if (!(r->i < r->n && r->s[r->i] == ':')) return bad(r, "expected ':'");
        r->i++;
      }
      json_value item; /* an array's element, for the numbers it returns */
      const bool keep = c == '[' && out && v->count < JSON_MAX_NUMBERS;
      if (value(r, depth + 1, keep ? &item : NULL)) return -1;
      if (keep) v->numbers[v->count] = item.type == JSON_NUMBER ? item.number : NAN;
      if (c == '[') v->count++;
      ws(r);
      if (r->i < r->n && r->s[r->i] == ',') {
        r->i++;
        continue;
      }
      if (r->i < r->n && r->s[r->i] == close_ch) {
        r->i++;
        return 0;
      }
      return bad(r, c == '{' ? "expected ',' or '}'" : "expected ',' or ']'");
    }
  }
  if (c == '"') {
    v->type = JSON_STRING;
    return string(r, v->string, sizeof v->string);
  }
  if (literal(r, "true"))
    v->type = JSON_BOOL, v->boolean = true;
  else if (literal(r, "false"))
    v->type = JSON_BOOL;
  else if (literal(r, "null"))
    v->type = JSON_NULL;
  else {
    v->type = JSON_NUMBER;
    return number(r, &v->number);
  }
  return 0;
}

int json_get(const char *text, size_t len, const char *key, json_value *out, char *err, size_t errlen) {
  reader r = {text, len, 0, err, errlen};
  int found = 0;
  ws(&r);
  if (!(r.i < r.n && r.s[r.i] == '{')) return bad(&r, "expected '{' (the document must be an object)");
  r.i++;
  ws(&r);
  if (r.i < r.n && r.s[r.i] == '}') {
    r.i++;
  } else {
    for (;;) {
      ws(&r);
      char name[256];
      if (string(&r, name, sizeof name)) return -1;
      ws(&r);
      if (!(r.i < r.n && r.s[r.i] == ':')) return bad(&r, "expected ':'");
      r.i++;
      bool match = strcmp(name, key) == 0;
      if (value(&r, 1, match ? out : NULL)) return -1;
      found |= match;
      ws(&r);
      if (r.i < r.n && r.s[r.i] == ',') {
        r.i++;
        continue;
      }
      if (r.i < r.n && r.s[r.i] == '}') {
        r.i++;
        break;
      }
      return bad(&r, "expected ',' or '}'");
    }
  }
  ws(&r);
  if (r.i != r.n) return bad(&r, "text after the document");
  return found;
}
