/*
 * npy.c — the .npy reader and writer (format in npy.h).
 *
 * Reading goes in three steps, each bounded by what the previous one proved: the preamble (magic, version,
 * header length) must fit in the bytes present; the header dict must fit too and parse exactly; only then
 * is the data size (shape product × item size, overflow-checked) compared with the bytes that really
 * follow, and only when they agree is a buffer allocated. A hostile file can therefore make the reader
 * allocate at most the header limit plus the data it actually contains.
 */
#include "npy.h"
#include "readfile.h"

#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static const unsigned char npy_magic[6] = {0x93, 'N', 'U', 'M', 'P', 'Y'};

static int fail(char *err, size_t errlen, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
static int fail(char *err, size_t errlen, const char *fmt, ...) {
  if (err && errlen) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
  }
  return -1;
}

size_t npy_dtype_size(npy_dtype dtype) {
  switch (dtype) {
  case NPY_F2: return 2;
  case NPY_F4: return 4;
  case NPY_F8: return 8;
  case NPY_B1: return 1;
  }
  return 0;
}

const char *npy_dtype_descr(npy_dtype dtype) {
  switch (dtype) {
  case NPY_F2: return "<f2";
  case NPY_F4: return "<f4";
  case NPY_F8: return "<f8";
  case NPY_B1: return "|b1";
  }
  return NULL;
}

const char *npy_shape_string(int ndim, const int64_t *shape, char *out, size_t len) {
  size_t used = 0;
  if (!out || len == 0) return out;
  out[0] = '\0';
#define NPY_APPEND(...)                                                                                                \
  do {                                                                                                                 \
    if (used < len) {                                                                                                  \
      int n_ = snprintf(out + used, len - used, __VA_ARGS__);                                                          \
      used += n_ > 0 ? (size_t)n_ : 0;                                                                                 \
    }                                                                                                                  \
  } while (0)
  NPY_APPEND("(");
  for (int i = 0; i < ndim; i++) NPY_APPEND("%s%lld", i ? ", " : "", (long long)shape[i]);
  NPY_APPEND(ndim == 1 ? ",)" : ")");
#undef NPY_APPEND
  return out;
}

void npy_free(npy_array *a) {
  if (!a) return;
  free(a->data);
  memset(a, 0, sizeof *a);
}

/* ---- byte order ---------------------------------------------------------------------------------------- */
static bool host_is_little_endian(void) {
  const uint16_t one = 1;
  unsigned char b;
  memcpy(&b, &one, 1);
  return b == 1;
}

/* Reverses each item of `size` bytes in place (the file is little-endian; a big-endian host swaps). */
static void swap_items(void *data, size_t count, size_t size) {
  unsigned char *p = data;
  for (size_t i = 0; i < count; i++, p += size)
    for (size_t a = 0, b = size - 1; a < b; a++, b--) {
      unsigned char t = p[a];
      p[a] = p[b];
      p[b] = t;
    }
}

/* ---- the header dict ------------------------------------------------------------------------------------ */
typedef struct {
  const char *s;
  size_t n, i;
  char *err;
  size_t errlen;
} cursor;

/* The character at the cursor as text for a message: 'x', or \xNN, or "end of header". */
static const char *describe_here(const cursor *c, char buf[16]) {
  if (c->i >= c->n) return "the end of the header";
  unsigned char ch = (unsigned char)c->s[c->i];
  if (ch >= 0x20 && ch < 0x7f)
    snprintf(buf, 16, "'%c'", ch);
  else
    snprintf(buf, 16, "byte \\x%02x", ch);
  return buf;
}

static int syntax(cursor *c, const char *expected) {
  char here[16];
  return fail(c->err, c->errlen, "npy header: expected %s at offset %zu of the header, found %s", expected, c->i,
              describe_here(c, here));
}

static void skip_ws(cursor *c) {
  while (c->i < c->n && (c->s[c->i] == ' ' || c->s[c->i] == '\t' || c->s[c->i] == '\n' || c->s[c->i] == '\r')) c->i++;
}

static bool peek(const cursor *c, char ch) { return c->i < c->n && c->s[c->i] == ch; }

static bool accept(cursor *c, char ch) {
  if (!peek(c, ch)) return false;
  c->i++;
  return true;
}

/* A Python string literal without escapes ('...' or "..."), at most cap-1 characters, into out. */
static int parse_string(cursor *c, char *out, size_t cap, const char *what) {
  if (!peek(c, '\'') && !peek(c, '"')) return syntax(c, what);
  char quote = c->s[c->i++];
  size_t len = 0;
  while (c->i < c->n && c->s[c->i] != quote) {
    unsigned char ch = (unsigned char)c->s[c->i];
    if (ch == '\\') return fail(c->err, c->errlen, "npy header: escape sequences in strings are not supported");
    if (ch < 0x20 || ch >= 0x7f)
      return fail(c->err, c->errlen, "npy header: byte \\x%02x inside a string at offset %zu is not printable ASCII",
                  ch, c->i);
    if (len + 1 >= cap) return fail(c->err, c->errlen, "npy header: %s is longer than %zu characters", what, cap - 1);
    out[len++] = (char)ch;
    c->i++;
  }
  if (c->i >= c->n) return fail(c->err, c->errlen, "npy header: unterminated string (%s)", what);
  c->i++;
  out[len] = '\0';
  return 0;
}

static bool accept_word(cursor *c, const char *word) {
  size_t len = strlen(word);
  if (c->n - c->i < len || memcmp(c->s + c->i, word, len) != 0) return false;
  /* a whole identifier, not the start of a longer one */
  if (c->i + len < c->n) {
    char next = c->s[c->i + len];
    if ((next >= 'a' && next <= 'z') || (next >= 'A' && next <= 'Z') || (next >= '0' && next <= '9') || next == '_')
      return false;
  }
  c->i += len;
  return true;
}

static int parse_descr(cursor *c, npy_dtype *dtype) {
  if (peek(c, '['))
    return fail(c->err, c->errlen,
                "npy header: structured dtypes (a list descr) are not supported; only '<f2', "
                "'<f4', '<f8', '|b1'");
  char d[32];
  if (parse_string(c, d, sizeof d, "the 'descr' string")) return -1;
  if (strcmp(d, "<f2") == 0)
    *dtype = NPY_F2;
  else if (strcmp(d, "<f4") == 0)
    *dtype = NPY_F4;
  else if (strcmp(d, "<f8") == 0)
    *dtype = NPY_F8;
  else if (strcmp(d, "|b1") == 0)
    *dtype = NPY_B1;
  else if (d[0] == '>')
    return fail(c->err, c->errlen,
                "npy header: big-endian dtype '%s' is not supported; only little-endian '<f2', "
                "'<f4', '<f8' and '|b1'",
                d);
  else
    return fail(c->err, c->errlen, "npy header: dtype '%s' is not supported; only '<f2', '<f4', '<f8', '|b1'", d);
  return 0;
}

static int parse_fortran_order(cursor *c, bool *fortran) {
  if (accept_word(c, "False"))
    *fortran = false;
  else if (accept_word(c, "True"))
    *fortran = true;
  else
    return syntax(c, "True or False for 'fortran_order'");
  return 0;
}

/* One dimension: decimal digits (Python 2 numpy appended 'L'), at most INT64_MAX. */
static int parse_dim(cursor *c, int64_t *out) {
  if (peek(c, '-')) return fail(c->err, c->errlen, "npy header: negative dimension in 'shape'");
  if (!(c->i < c->n && c->s[c->i] >= '0' && c->s[c->i] <= '9')) return syntax(c, "a dimension (digits)");
  int64_t v = 0;
  while (c->i < c->n && c->s[c->i] >= '0' && c->s[c->i] <= '9') {
    int digit = c->s[c->i] - '0';
    if (v > (INT64_MAX - digit) / 10)
      return fail(c->err, c->errlen, "npy header: a dimension in 'shape' exceeds 2^63-1");
    v = v * 10 + digit;
    c->i++;
  }
  if (peek(c, 'L') || peek(c, 'l')) c->i++;
  *out = v;
  return 0;
}

/* (), (n,), (n, m), (n, m,) ... — a Python tuple of at most NPY_MAX_DIMS integers. */
static int parse_shape(cursor *c, int *ndim, int64_t *shape) {
  if (!accept(c, '(')) return syntax(c, "'(' opening the 'shape' tuple");
  *ndim = 0;
  skip_ws(c);
  if (accept(c, ')')) return 0;
  for (;;) {
    if (*ndim == NPY_MAX_DIMS)
      return fail(c->err, c->errlen, "npy header: 'shape' has more than %d dimensions", NPY_MAX_DIMS);
    if (parse_dim(c, &shape[(*ndim)++])) return -1;
    skip_ws(c);
    if (accept(c, ')')) {
      if (*ndim == 1)
        return fail(c->err, c->errlen, "npy header: 'shape' (%lld) is not a tuple; one dimension is written (%lld,)",
                    (long long)shape[0], (long long)shape[0]);
      return 0;
    }
    if (!accept(c, ',')) return syntax(c, "',' or ')' in 'shape'");
    skip_ws(c);
    if (accept(c, ')')) return 0;
  }
}

/* The whole header text: {'descr': ..., 'fortran_order': ..., 'shape': ...} in any order, each key once,
 * an optional trailing comma, surrounded by whitespace (numpy pads with spaces and ends with '\n'). */
static int parse_dict(const char *text, size_t n, npy_array *out, char *err, size_t errlen) {
  cursor c = {text, n, 0, err, errlen};
  bool have_descr = false, have_fortran = false, have_shape = false, fortran = false;
  skip_ws(&c);
  if (!accept(&c, '{')) return syntax(&c, "'{' opening the header dict");
  for (;;) {
    skip_ws(&c);
    if (accept(&c, '}')) break;
    char key[32];
    if (parse_string(&c, key, sizeof key, "a quoted key")) return -1;
    skip_ws(&c);
    if (!accept(&c, ':')) return syntax(&c, "':' after a key");
    skip_ws(&c);
    bool *seen = strcmp(key, "descr") == 0           ? &have_descr
                 : strcmp(key, "fortran_order") == 0 ? &have_fortran
                 : strcmp(key, "shape") == 0         ? &have_shape
                                                     : NULL;
    if (!seen)
      return fail(err, errlen, "npy header: unknown key '%s' (expected 'descr', 'fortran_order', 'shape')", key);
    if (*seen) return fail(err, errlen, "npy header: key '%s' appears twice", key);
    *seen = true;
    int r = seen == &have_descr     ? parse_descr(&c, &out->dtype)
            : seen == &have_fortran ? parse_fortran_order(&c, &fortran)
                                    : parse_shape(&c, &out->ndim, out->shape);
    if (r) return -1;
    skip_ws(&c);
    if (accept(&c, '}')) break;
    if (!accept(&c, ',')) return syntax(&c, "',' or '}' after a value");
  }
  skip_ws(&c);
  if (c.i != c.n) return syntax(&c, "only whitespace after the header dict");
  if (!have_descr) return fail(err, errlen, "npy header: key 'descr' is missing");
  if (!have_fortran) return fail(err, errlen, "npy header: key 'fortran_order' is missing");
  if (!have_shape) return fail(err, errlen, "npy header: key 'shape' is missing");
  if (fortran)
    return fail(err, errlen,
                "npy header: fortran_order True (column-major data) is not supported; save the array "
                "in C order (np.ascontiguousarray)");
  return 0;
}

/* ---- preamble, header, data size ------------------------------------------------------------------------ */
/* Bytes needed to learn the header length: magic + version, then a u16 (1.0) or u32 (2.0, 3.0). */
enum { NPY_PREAMBLE_V1 = 10, NPY_PREAMBLE_V2 = 12 };

/* From the first `have` bytes: the version and where the header lies. Checks only the preamble. */
static int parse_preamble(const unsigned char *b, size_t have, size_t *header_start, size_t *header_len, char *err,
                          size_t errlen) {
  if (have < 8) return fail(err, errlen, "npy: truncated: %zu bytes, but the magic and version alone need 8", have);
  if (memcmp(b, npy_magic, sizeof npy_magic) != 0)
    return fail(err, errlen, "npy: not a .npy file: the first 6 bytes are not \\x93NUMPY");
  int major = b[6], minor = b[7];
  if (major < 1 || major > 3 || minor != 0)
    return fail(err, errlen, "npy: unsupported format version %d.%d (supported: 1.0, 2.0, 3.0)", major, minor);
  size_t pre = major == 1 ? NPY_PREAMBLE_V1 : NPY_PREAMBLE_V2;
  if (have < pre)
    return fail(err, errlen, "npy: truncated: %zu bytes, but a version %d.0 preamble needs %zu", have, major, pre);
  uint32_t hl = major == 1 ? (uint32_t)b[8] | (uint32_t)b[9] << 8
                           : (uint32_t)b[8] | (uint32_t)b[9] << 8 | (uint32_t)b[10] << 16 | (uint32_t)b[11] << 24;
  if (hl > NPY_MAX_HEADER_LEN)
    return fail(err, errlen, "npy: header length %u is absurd (limit %u)", (unsigned)hl, NPY_MAX_HEADER_LEN);
  if (hl == 0) return fail(err, errlen, "npy: header length is 0");
  *header_start = pre;
  *header_len = hl;
  return 0;
}

/* Shape product and byte count, overflow-checked. */
static int data_bytes(npy_array *a, size_t *bytes, char *err, size_t errlen) {
  int64_t count = 1;
  for (int i = 0; i < a->ndim; i++) {
    if (a->shape[i] < 0)
      return fail(err, errlen, "npy: shape[%d] is %lld; dimensions must be >= 0", i, (long long)a->shape[i]);
    if (__builtin_mul_overflow(count, a->shape[i], &count)) {
      char s[200];
      return fail(err, errlen, "npy: shape %s has more than 2^63 elements",
                  npy_shape_string(a->ndim, a->shape, s, sizeof s));
    }
  }
  size_t b;
  if ((uint64_t)count > SIZE_MAX || __builtin_mul_overflow((size_t)count, npy_dtype_size(a->dtype), &b)) {
    char s[200];
    return fail(err, errlen, "npy: shape %s of %s needs more bytes than this machine can address",
                npy_shape_string(a->ndim, a->shape, s, sizeof s), npy_dtype_descr(a->dtype));
  }
  a->count = count;
  *bytes = b;
  return 0;
}

/* The preamble and header dict from `buf` (which holds at least the whole header), into *meta, and where
 * the data starts. */
static int parse_head(const unsigned char *buf, size_t have, npy_array *meta, size_t *data_start, size_t *need,
                      char *err, size_t errlen) {
  size_t hs = 0, hl = 0; /* set by parse_preamble on success; zero keeps -O3 -Wmaybe-uninitialized quiet */
  if (parse_preamble(buf, have, &hs, &hl, err, errlen)) return -1;
  if (have - hs < hl)
    return fail(err, errlen, "npy: truncated or lying header length: it says %zu bytes but only %zu follow", hl,
                have - hs);
  memset(meta, 0, sizeof *meta);
  if (parse_dict((const char *)buf + hs, hl, meta, err, errlen)) return -1;
  if (data_bytes(meta, need, err, errlen)) return -1;
  *data_start = hs + hl;
  return 0;
}

static int check_data_size(const npy_array *meta, size_t need, size_t have, char *err, size_t errlen) {
  if (have == need) return 0;
  char s[200];
  npy_shape_string(meta->ndim, meta->shape, s, sizeof s);
  if (have < need)
    return fail(err, errlen, "npy: data is truncated: shape %s of %s needs %zu bytes but the file holds %zu", s,
                npy_dtype_descr(meta->dtype), need, have);
  return fail(err, errlen, "npy: %zu bytes of data but shape %s of %s needs %zu (trailing bytes)", have, s,
              npy_dtype_descr(meta->dtype), need);
}

static int finish(npy_array *out, const npy_array *meta, void *data) {
  *out = *meta;
  out->data = data;
  if (!host_is_little_endian()) swap_items(out->data, (size_t)out->count, npy_dtype_size(out->dtype));
  return 0;
}

int npy_parse(const void *buf, size_t len, npy_array *out, char *err, size_t errlen) {
  if (!out) return fail(err, errlen, "npy_parse: out is NULL");
  memset(out, 0, sizeof *out);
  if (!buf && len) return fail(err, errlen, "npy_parse: buf is NULL");
  const unsigned char *b = buf;
  npy_array meta;
  size_t start, need;
  if (parse_head(b, len, &meta, &start, &need, err, errlen)) return -1;
  if (check_data_size(&meta, need, len - start, err, errlen)) return -1;
  void *data = malloc(need ? need : 1);
  if (!data) return fail(err, errlen, "npy: out of memory allocating %zu bytes", need);
  if (need) memcpy(data, b + start, need);
  return finish(out, &meta, data);
}

/* ---- files ---------------------------------------------------------------------------------------------- */
/* Reads exactly n bytes; false at end of file or on an error. */
static bool read_exact(FILE *f, void *buf, size_t n) { return fread(buf, 1, n, f) == n; }

int npy_read(const char *path, npy_array *out, char *err, size_t errlen) {
  if (!out) return fail(err, errlen, "npy_read: out is NULL");
  memset(out, 0, sizeof *out);
  if (!path) return fail(err, errlen, "npy_read: path is NULL");
  char why[400];
  FILE *f = io_open_regular(path, why, sizeof why); /* a FIFO is refused here, not waited on */
  if (!f) return fail(err, errlen, "%s: %s", path, why);
  unsigned char *head = NULL;
  void *data = NULL;
  struct stat st;
  if (fstat(fileno(f), &st) != 0) {
    fail(why, sizeof why, "cannot stat: %s", strerror(errno));
    goto failed;
  }
  size_t file_size = (size_t)st.st_size;
  unsigned char pre[NPY_PREAMBLE_V2];
  size_t have_pre = file_size < sizeof pre ? file_size : sizeof pre;
  if (!read_exact(f, pre, have_pre)) {
    fail(why, sizeof why, "read error");
    goto failed;
  }
  size_t hs = 0, hl = 0; /* set by parse_preamble on success; zero keeps -O3 -Wmaybe-uninitialized quiet */
  if (parse_preamble(pre, have_pre, &hs, &hl, why, sizeof why)) goto failed;
  /* The header length is bounded by NPY_MAX_HEADER_LEN, so this allocation is too; a file shorter than
   * its header says fails in parse_head with the lying-length message. */
  size_t head_len = hs + hl <= file_size ? hs + hl : file_size;
  head = malloc(head_len);
  if (!head) {
    fail(why, sizeof why, "out of memory for a %zu-byte header", head_len);
    goto failed;
  }
  memcpy(head, pre, have_pre < head_len ? have_pre : head_len);
  if (head_len > have_pre && !read_exact(f, head + have_pre, head_len - have_pre)) {
    fail(why, sizeof why, "read error in the header");
    goto failed;
  }
  npy_array meta;
  size_t start, need;
  if (parse_head(head, head_len, &meta, &start, &need, why, sizeof why)) goto failed;
  if (check_data_size(&meta, need, file_size - start, why, sizeof why)) goto failed;
  data = malloc(need ? need : 1);
  if (!data) {
    fail(why, sizeof why, "out of memory allocating %zu bytes of data", need);
    goto failed;
  }
  if (need && !read_exact(f, data, need)) {
    fail(why, sizeof why, "read error in the data (the file changed while it was read?)");
    goto failed;
  }
  free(head);
  fclose(f);
  return finish(out, &meta, data);
failed:
  free(head);
  free(data);
  fclose(f);
  /* "npy: ..." messages get the path in front. */
  return fail(err, errlen, "%s: %s", path, strncmp(why, "npy: ", 5) == 0 ? why + 5 : why);
}

/* ---- writing -------------------------------------------------------------------------------------------- */
/* Preamble + header dict into hdr[cap], padded with spaces so that the data starts at a multiple of 64
 * bytes (numpy's alignment) and ended by '\n'; *total is its length. The array was checked. */
static int build_header(const npy_array *a, int version_major, unsigned char *hdr, size_t cap, size_t *total_out,
                        char *err, size_t errlen) {
  char shape[200], dict[300];
  npy_shape_string(a->ndim, a->shape, shape, sizeof shape);
  int dl = snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': %s, }",
                    npy_dtype_descr(a->dtype), shape);
  int major = version_major ? version_major : 1; /* our headers are far below the 1.0 limit of 65535 */
  size_t pre = major == 1 ? NPY_PREAMBLE_V1 : NPY_PREAMBLE_V2;
  size_t total = pre + (size_t)dl + 1;
  total = (total + 63) / 64 * 64;
  if (dl < 0 || (size_t)dl >= sizeof dict || total > cap) return fail(err, errlen, "npy: header too long");
  size_t hl = total - pre;
  memcpy(hdr, npy_magic, sizeof npy_magic);
  hdr[6] = (unsigned char)major;
  hdr[7] = 0;
  hdr[8] = (unsigned char)(hl & 0xff);
  hdr[9] = (unsigned char)(hl >> 8 & 0xff);
  if (major != 1) {
    hdr[10] = (unsigned char)(hl >> 16 & 0xff);
    hdr[11] = (unsigned char)(hl >> 24 & 0xff);
  }
  memcpy(hdr + pre, dict, (size_t)dl);
  memset(hdr + pre + dl, ' ', hl - (size_t)dl - 1);
  hdr[total - 1] = '\n';
  *total_out = total;
  return 0;
}

static int check_for_writing(const npy_array *a, int version_major, size_t *bytes, char *err, size_t errlen) {
  if (!a) return fail(err, errlen, "npy: array is NULL");
  if (npy_dtype_size(a->dtype) == 0) return fail(err, errlen, "npy: dtype %d is not an npy_dtype", (int)a->dtype);
  if (a->ndim < 0 || a->ndim > NPY_MAX_DIMS)
    return fail(err, errlen, "npy: ndim %d is outside [0, %d]", a->ndim, NPY_MAX_DIMS);
  if (version_major < 0 || version_major > 3)
    return fail(err, errlen, "npy: version %d is not 1, 2, 3 (or 0 for automatic)", version_major);
  npy_array copy = *a;
  if (data_bytes(&copy, bytes, err, errlen)) return -1;
  if (*bytes && !a->data) return fail(err, errlen, "npy: data is NULL");
  return 0;
}

int npy_encode(const npy_array *a, int version_major, void **buf, size_t *len, char *err, size_t errlen) {
  if (!buf || !len) return fail(err, errlen, "npy_encode: buf or len is NULL");
  *buf = NULL;
  *len = 0;
  size_t bytes;
  if (check_for_writing(a, version_major, &bytes, err, errlen)) return -1;
  unsigned char hdr[512];
  size_t hl;
  if (build_header(a, version_major, hdr, sizeof hdr, &hl, err, errlen)) return -1;
  if (bytes > SIZE_MAX - hl) return fail(err, errlen, "npy: the file would exceed the address space");
  unsigned char *out = malloc(hl + bytes);
  if (!out) return fail(err, errlen, "npy: out of memory allocating %zu bytes", hl + bytes);
  memcpy(out, hdr, hl);
  if (bytes) memcpy(out + hl, a->data, bytes);
  if (!host_is_little_endian()) swap_items(out + hl, bytes / npy_dtype_size(a->dtype), npy_dtype_size(a->dtype));
  *buf = out;
  *len = hl + bytes;
  return 0;
}

/* Writes the data in host order, swapping through a small buffer on a big-endian host. */
static bool write_data(FILE *f, const npy_array *a, size_t bytes) {
  if (host_is_little_endian()) return fwrite(a->data, 1, bytes, f) == bytes;
  size_t item = npy_dtype_size(a->dtype);
  unsigned char chunk[1 << 14];
  const unsigned char *src = a->data;
  for (size_t done = 0; done < bytes;) {
    size_t n = bytes - done < sizeof chunk ? bytes - done : sizeof chunk;
    memcpy(chunk, src + done, n);
    swap_items(chunk, n / item, item);
    if (fwrite(chunk, 1, n, f) != n) return false;
    done += n;
  }
  return true;
}

int npy_write(const char *path, const npy_array *a, int version_major, char *err, size_t errlen) {
  if (!path) return fail(err, errlen, "npy_write: path is NULL");
  size_t bytes;
  char why[300];
  if (check_for_writing(a, version_major, &bytes, why, sizeof why)) return fail(err, errlen, "%s: %s", path, why);
  unsigned char hdr[512];
  size_t hl;
  if (build_header(a, version_major, hdr, sizeof hdr, &hl, why, sizeof why))
    return fail(err, errlen, "%s: %s", path, why);
  FILE *f = fopen(path, "wb");
  if (!f) return fail(err, errlen, "%s: cannot create: %s", path, strerror(errno));
  bool ok = fwrite(hdr, 1, hl, f) == hl && write_data(f, a, bytes);
  int saved = errno;
  if (fclose(f) != 0 && ok) {
    ok = false;
    saved = errno;
  }
  if (!ok) {
    remove(path); /* no half-written file left behind */
    return fail(err, errlen, "%s: write failed: %s", path, strerror(saved));
  }
  return 0;
}
