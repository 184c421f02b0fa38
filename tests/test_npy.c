/*
 * test_npy.c — the .npy reader and writer: round trips for every version and dtype, headers as numpy
 * writes them (and as it could), and every kind of hostile input, each asserted with its error message.
 */
#include "npy.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int failures;

#define EXPECT(cond, ...)                                                                                              \
  do {                                                                                                                 \
    if (!(cond)) {                                                                                                     \
      failures++;                                                                                                      \
      fprintf(stderr, "%s:%d: FAILED: %s: ", __FILE__, __LINE__, #cond);                                               \
      fprintf(stderr, __VA_ARGS__);                                                                                    \
      fputc('\n', stderr);                                                                                             \
    }                                                                                                                  \
  } while (0)

static char tmpdir[256];

static const char *tmp_path(const char *name) {
  static char path[512];
  snprintf(path, sizeof path, "%s/%s", tmpdir, name);
  return path;
}

static void write_bytes(const char *path, const void *buf, size_t len) {
  FILE *f = fopen(path, "wb");
  if (!f || fwrite(buf, 1, len, f) != len) {
    fprintf(stderr, "cannot write %s\n", path);
    exit(2);
  }
  fclose(f);
}

/* Fills an array of `dtype` with distinct, non-trivial bit patterns (never zeros). */
static void fill(void *data, npy_dtype dtype, int64_t count, unsigned seed) {
  size_t size = npy_dtype_size(dtype);
  unsigned char *p = data;
  uint32_t x = seed * 2654435761u + 12345u;
  for (int64_t i = 0; i < count * (int64_t)size; i++) {
    x = x * 1664525u + 1013904223u;
    p[i] = (unsigned char)(x >> 24);
  }
}

/* ---- round trips ---------------------------------------------------------------------------------------- */
static void check_same(const npy_array *a, const npy_array *b, const char *what) {
  EXPECT(a->dtype == b->dtype, "%s: dtype %d vs %d", what, a->dtype, b->dtype);
  EXPECT(a->ndim == b->ndim, "%s: ndim %d vs %d", what, a->ndim, b->ndim);
  int64_t count = 1;
  for (int i = 0; i < a->ndim && i < b->ndim; i++) {
    EXPECT(a->shape[i] == b->shape[i], "%s: shape[%d] %lld vs %lld", what, i, (long long)a->shape[i],
           (long long)b->shape[i]);
    count *= a->shape[i];
  }
  EXPECT(b->count == count, "%s: count %lld, expected %lld", what, (long long)b->count, (long long)count);
  EXPECT(b->data != NULL, "%s: data is NULL", what);
  if (b->data && a->data && b->count == count)
    EXPECT(memcmp(a->data, b->data, (size_t)count * npy_dtype_size(a->dtype)) == 0, "%s: data differs", what);
}

static void test_round_trips(void) {
  static const int64_t shapes[][NPY_MAX_DIMS] = {{0}, {0}, {7}, {2, 3}, {2, 3, 4, 5}, {1, 2, 1, 3, 1, 2, 1, 2}, {3, 0}};
  static const int ndims[] = {0, 1, 1, 2, 4, 8, 2};
  int n_shapes = (int)(sizeof ndims / sizeof ndims[0]);
  for (int version = 0; version <= 3; version++)
    for (int dt = NPY_F2; dt <= NPY_B1; dt++)
      for (int s = 0; s < n_shapes; s++) {
        npy_array a = {.dtype = (npy_dtype)dt, .ndim = ndims[s]};
        int64_t count = 1;
        for (int i = 0; i < a.ndim; i++) count *= a.shape[i] = shapes[s][i];
        a.data = malloc((size_t)count * npy_dtype_size(a.dtype) + 1);
        fill(a.data, a.dtype, count, (unsigned)(version * 100 + dt * 10 + s));
        char what[96], err[300] = "";
        snprintf(what, sizeof what, "version %d, %s, shape #%d", version, npy_dtype_descr(a.dtype), s);

        void *buf;
        size_t len;
        EXPECT(npy_encode(&a, version, &buf, &len, err, sizeof err) == 0, "%s: encode: %s", what, err);
        const unsigned char *b = buf;
        int major = version ? version : 1;
        EXPECT(b[6] == major && b[7] == 0, "%s: version bytes %d.%d", what, b[6], b[7]);
        size_t data_start = major == 1 ? 10u + (b[8] | b[9] << 8) : 12u + (b[8] | b[9] << 8 | b[10] << 16);
        EXPECT(data_start % 64 == 0, "%s: data starts at %zu, not a multiple of 64", what, data_start);
        EXPECT(b[data_start - 1] == '\n', "%s: header does not end with a newline", what);
        EXPECT(len == data_start + (size_t)count * npy_dtype_size(a.dtype), "%s: length %zu", what, len);

        npy_array r;
        EXPECT(npy_parse(buf, len, &r, err, sizeof err) == 0, "%s: parse: %s", what, err);
        check_same(&a, &r, what);
        npy_free(&r);
        EXPECT(r.data == NULL && r.ndim == 0, "%s: npy_free did not clear the array", what);

        const char *path = tmp_path("round.npy");
        EXPECT(npy_write(path, &a, version, err, sizeof err) == 0, "%s: write: %s", what, err);
        EXPECT(npy_read(path, &r, err, sizeof err) == 0, "%s: read: %s", what, err);
        check_same(&a, &r, what);
        npy_free(&r);

        /* The file on disk is byte-identical to the encoded buffer. */
        FILE *f = fopen(path, "rb");
        unsigned char *disk = malloc(len + 1);
        size_t got = f ? fread(disk, 1, len + 1, f) : 0;
        if (f) fclose(f);
        EXPECT(got == len && memcmp(disk, buf, len) == 0, "%s: file differs from npy_encode's bytes", what);
        free(disk);
        free(buf);
        free(a.data);
      }
}

/* ---- headers as numpy writes them ----------------------------------------------------------------------- */
/* A .npy buffer from a version, a header text (used as is, no padding) and `data_bytes` bytes of data. */
static size_t make_file(unsigned char *out, size_t cap, int major, int minor, const char *header, size_t data_bytes) {
  size_t hl = strlen(header), pre = major == 1 ? 10 : 12;
  memcpy(out, "\x93NUMPY", 6);
  out[6] = (unsigned char)major;
  out[7] = (unsigned char)minor;
  out[8] = (unsigned char)(hl & 0xff);
  out[9] = (unsigned char)(hl >> 8 & 0xff);
  if (pre == 12) out[10] = (unsigned char)(hl >> 16 & 0xff), out[11] = (unsigned char)(hl >> 24);
  if (pre + hl + data_bytes > cap) {
    fprintf(stderr, "make_file: buffer too small\n");
    exit(2);
  }
  memcpy(out + pre, header, hl);
  for (size_t i = 0; i < data_bytes; i++) out[pre + hl + i] = (unsigned char)(i * 37 + 11);
  return pre + hl + data_bytes;
}

static void expect_header_ok(int major, const char *header, npy_dtype dtype, int ndim, const int64_t *shape,
                             size_t data_bytes) {
  unsigned char buf[4096];
  size_t len = make_file(buf, sizeof buf, major, 0, header, data_bytes);
  npy_array r;
  char err[300] = "";
  int rc = npy_parse(buf, len, &r, err, sizeof err);
  EXPECT(rc == 0, "header %s: %s", header, err);
  if (rc) return;
  EXPECT(r.dtype == dtype, "header %s: dtype %d", header, r.dtype);
  EXPECT(r.ndim == ndim, "header %s: ndim %d", header, r.ndim);
  for (int i = 0; i < ndim && i < r.ndim; i++) EXPECT(r.shape[i] == shape[i], "header %s: shape[%d]", header, i);
  npy_free(&r);
}

static void test_numpy_headers(void) {
  /* np.save(f, np.arange(6, dtype='<f4').reshape(2, 3)) with numpy 1.26: these 128 bytes, then the data. */
  static const char numpy_v1[] = "\x93NUMPY\x01\x00\x76\x00{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), "
                                 "}                                                          \n";
  unsigned char buf[256];
  EXPECT(sizeof numpy_v1 - 1 == 128, "the literal is %zu bytes", sizeof numpy_v1 - 1);
  memcpy(buf, numpy_v1, 128);
  for (int i = 0; i < 6; i++) {
    float x = (float)i;
    memcpy(buf + 128 + 4 * i, &x, 4);
  }
  npy_array r;
  char err[300] = "";
  EXPECT(npy_parse(buf, 128 + 24, &r, err, sizeof err) == 0, "numpy's own file: %s", err);
  EXPECT(r.dtype == NPY_F4 && r.ndim == 2 && r.shape[0] == 2 && r.shape[1] == 3 && r.count == 6, "numpy's shape");
  EXPECT(r.data && ((float *)r.data)[5] == 5.0f, "numpy's data");
  npy_free(&r);
  /* And our writer produces exactly those bytes. */
  float six[6] = {0, 1, 2, 3, 4, 5};
  npy_array a = {.dtype = NPY_F4, .ndim = 2, .shape = {2, 3}, .data = six};
  void *enc;
  size_t enc_len;
  EXPECT(npy_encode(&a, 0, &enc, &enc_len, err, sizeof err) == 0, "encode: %s", err);
  EXPECT(enc_len == 152 && memcmp(enc, buf, 152) == 0, "our bytes differ from numpy's");
  free(enc);

  const int64_t s23[] = {2, 3}, s5[] = {5}, s0[] = {0}, s1x1[] = {1, 1};
  /* Key order, quotes, whitespace, trailing comma, Python 2 'L' suffixes, versions 2.0 and 3.0. */
  expect_header_ok(1, "{'shape': (2, 3), 'descr': '<f4', 'fortran_order': False}\n", NPY_F4, 2, s23, 24);
  expect_header_ok(1, "{\"descr\": \"<f8\", \"fortran_order\": False, \"shape\": (5,)}", NPY_F8, 1, s5, 40);
  expect_header_ok(1, "  {  'descr'  :  '<f2' ,\n 'fortran_order':False,'shape':( 5 , ) , }  \n", NPY_F2, 1, s5, 10);
  expect_header_ok(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2L, 3L), }", NPY_F4, 2, s23, 24);
  expect_header_ok(2, "{'descr': '<f4', 'fortran_order': False, 'shape': (0,), }\n", NPY_F4, 1, s0, 0);
  expect_header_ok(3, "{'descr': '<f8', 'fortran_order': False, 'shape': (1, 1,), }\n", NPY_F8, 2, s1x1, 8);
  expect_header_ok(1, "{'descr': '<f8', 'fortran_order': False, 'shape': (), }\n", NPY_F8, 0, NULL, 8);
  /* np.save of a bool array (an attention mask): numpy writes its descr '|b1', one byte per element. */
  expect_header_ok(1, "{'descr': '|b1', 'fortran_order': False, 'shape': (2, 3), }\n", NPY_B1, 2, s23, 6);
}

/* ---- hostile input -------------------------------------------------------------------------------------- */
static void expect_parse_error(const void *buf, size_t len, const char *expected, const char *what) {
  npy_array r;
  memset(&r, 0x5a, sizeof r); /* poisoned: the parser must clear it */
  char err[400] = "";
  int rc = npy_parse(buf, len, &r, err, sizeof err);
  EXPECT(rc == -1, "%s: parsed, but should fail with '%s'", what, expected);
  EXPECT(strstr(err, expected) != NULL, "%s: error '%s' does not contain '%s'", what, err, expected);
  EXPECT(r.data == NULL && r.ndim == 0, "%s: the array was not cleared on failure", what);
  if (rc == 0) npy_free(&r);
}

static void expect_header_error(int major, const char *header, size_t data_bytes, const char *expected) {
  unsigned char buf[4096];
  size_t len = make_file(buf, sizeof buf, major, 0, header, data_bytes);
  expect_parse_error(buf, len, expected, header);
}

static void test_malformed(void) {
  unsigned char buf[4096];
  const char *good = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }\n";
  size_t good_len = make_file(buf, sizeof buf, 1, 0, good, 24);

  /* Truncated anywhere: every proper prefix of a valid file is refused. */
  for (size_t n = 0; n < good_len; n++) {
    char what[64];
    snprintf(what, sizeof what, "prefix of %zu bytes", n);
    const char *expected = n < 8                   ? "truncated"
                           : n < 10                ? "truncated"
                           : n < 10 + strlen(good) ? "lying header length"
                                                   : "data is truncated";
    expect_parse_error(buf, n, expected, what);
  }
  expect_parse_error(NULL, 0, "truncated", "empty input");

  unsigned char bad[4096];
  memcpy(bad, buf, good_len);
  bad[1] = 'n';
  expect_parse_error(bad, good_len, "not a .npy file", "wrong magic");
  memcpy(bad, buf, good_len);
  bad[6] = 4;
  expect_parse_error(bad, good_len, "unsupported format version 4.0", "version 4.0");
  memcpy(bad, buf, good_len);
  bad[7] = 1;
  expect_parse_error(bad, good_len, "unsupported format version 1.1", "version 1.1");
  memcpy(bad, buf, good_len);
  bad[6] = 0;
  expect_parse_error(bad, good_len, "unsupported format version 0.0", "version 0.0");

  /* The header length lies: longer than the file, shorter than the dict, zero, absurd. */
  memcpy(bad, buf, good_len);
  bad[8] = 0xff, bad[9] = 0x7f;
  expect_parse_error(bad, good_len, "lying header length", "header length 32767 in a small file");
  memcpy(bad, buf, good_len);
  bad[8] = 20, bad[9] = 0;
  expect_parse_error(bad, good_len, "unterminated string", "header length cuts the dict");
  memcpy(bad, buf, good_len);
  bad[8] = 0, bad[9] = 0;
  expect_parse_error(bad, good_len, "header length is 0", "header length 0");
  size_t v2 = make_file(bad, sizeof bad, 2, 0, good, 24);
  bad[8] = bad[9] = bad[10] = bad[11] = 0xff;
  expect_parse_error(bad, v2, "header length 4294967295 is absurd", "header length 2^32-1");
  bad[8] = 0x01, bad[9] = 0x00, bad[10] = 0x01, bad[11] = 0x00;
  expect_parse_error(bad, v2, "header length 65537 is absurd", "header length 65537");

  /* Data shorter or longer than the shape says. */
  expect_header_error(1, good, 23, "data is truncated: shape (2, 3) of <f4 needs 24 bytes but the file holds 23");
  expect_header_error(1, good, 25, "25 bytes of data but shape (2, 3) of <f4 needs 24 (trailing bytes)");
  expect_header_error(1, good, 0, "needs 24 bytes but the file holds 0");

  /* Shapes: overflow, huge (refused before allocating: the data is not there), too many dims. */
  expect_header_error(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (4294967296, 4294967296), }", 0,
                      "more than 2^63 elements");
  expect_header_error(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (4611686018427387904,), }", 0,
                      "more bytes than this machine can address");
  expect_header_error(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,), }", 0,
                      "exceeds 2^63-1");
  expect_header_error(1, "{'descr': '<f8', 'fortran_order': False, 'shape': (1099511627776, 1024), }", 16,
                      "needs 9007199254740992 bytes but the file holds 16");
  expect_header_error(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (1,1,1,1,1,1,1,1,1), }", 4,
                      "more than 8 dimensions");
  expect_header_error(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (-1, 3), }", 0, "negative dimension");
  expect_header_error(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (5), }", 20, "is not a tuple");
  expect_header_error(1, "{'descr': '<f4', 'fortran_order': False, 'shape': [2, 3], }", 24, "'(' opening");
  expect_header_error(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2 3), }", 24, "',' or ')'");
  expect_header_error(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2,,3), }", 24, "a dimension");

  /* Fortran order, and dtypes: big-endian, integer, complex, byte, structured. */
  expect_header_error(1, "{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }", 24,
                      "fortran_order True (column-major data) is not supported");
  expect_header_error(1, "{'descr': '>f4', 'fortran_order': False, 'shape': (2, 3), }", 24,
                      "big-endian dtype '>f4' is not supported");
  expect_header_error(1, "{'descr': '>f8', 'fortran_order': False, 'shape': (2,), }", 16, "big-endian dtype '>f8'");
  expect_header_error(1, "{'descr': '<i4', 'fortran_order': False, 'shape': (2, 3), }", 24,
                      "dtype '<i4' is not supported");
  expect_header_error(1, "{'descr': '<c8', 'fortran_order': False, 'shape': (2,), }", 16, "dtype '<c8'");
  expect_header_error(1, "{'descr': '|u1', 'fortran_order': False, 'shape': (2,), }", 2, "dtype '|u1'");
  expect_header_error(1, "{'descr': '<f16', 'fortran_order': False, 'shape': (2,), }", 32, "dtype '<f16'");
  expect_header_error(1, "{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (2,), }", 8, "structured dtypes");

  /* The dict itself. */
  expect_header_error(1, "{'fortran_order': False, 'shape': (2, 3), }", 24, "key 'descr' is missing");
  expect_header_error(1, "{'descr': '<f4', 'shape': (2, 3), }", 24, "key 'fortran_order' is missing");
  expect_header_error(1, "{'descr': '<f4', 'fortran_order': False, }", 4, "key 'shape' is missing");
  expect_header_error(1, "{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", 24,
                      "key 'descr' appears twice");
  expect_header_error(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), 'x': 1}", 24, "unknown key 'x'");
  expect_header_error(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), } junk", 24,
                      "only whitespace after the header dict");
  expect_header_error(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3)", 24, "',' or '}'");
  expect_header_error(1, "['descr', '<f4']", 24, "'{' opening the header dict");
  expect_header_error(1, "{'descr: '<f4', 'fortran_order': False, 'shape': (2, 3), }", 24, "expected ':'");
  expect_header_error(1, "{'descr': '<f4, 'fortran_order': False, 'shape': (2, 3), }", 24, "dtype '<f4, ' is not");
  expect_header_error(1, "{'descr': '<f4", 24, "unterminated string");
  expect_header_error(1, "{'descr': '<\\x66\\x34', 'fortran_order': False, 'shape': (2, 3), }", 24, "escape");
  expect_header_error(1, "{'descr': '<f4', 'fortran_order': false, 'shape': (2, 3), }", 24, "True or False");
  expect_header_error(1, "{'descr': '<f4', 'fortran_order': Falsey, 'shape': (2, 3), }", 24, "True or False");
  expect_header_error(1, "{'descr': '<f4', 'fortran_order': 0, 'shape': (2, 3), }", 24, "True or False");
  expect_header_error(3, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), '\xc3\xa9': 1}", 24,
                      "not printable ASCII");
  expect_header_error(1, "{'descrdescrdescrdescrdescrdescrdescr': 1}", 24, "longer than 31 characters");
}

/* ---- files ---------------------------------------------------------------------------------------------- */
static void expect_read_error(const char *path, const char *expected, const char *what) {
  npy_array r;
  char err[400] = "";
  int rc = npy_read(path, &r, err, sizeof err);
  EXPECT(rc == -1, "%s: read, but should fail with '%s'", what, expected);
  EXPECT(strstr(err, expected) != NULL, "%s: error '%s' does not contain '%s'", what, err, expected);
  EXPECT(strstr(err, path) != NULL, "%s: error '%s' does not name the file", what, err);
  if (rc == 0) npy_free(&r);
}

static void test_files(void) {
  unsigned char buf[4096];
  const char *good = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }\n";
  size_t len = make_file(buf, sizeof buf, 1, 0, good, 24);

  expect_read_error(tmp_path("does-not-exist.npy"), "cannot open", "missing file");
  expect_read_error(tmpdir, "not a regular file", "a directory");
  write_bytes(tmp_path("empty.npy"), buf, 0);
  expect_read_error(tmp_path("empty.npy"), "truncated", "empty file");
  write_bytes(tmp_path("short-preamble.npy"), buf, 9);
  expect_read_error(tmp_path("short-preamble.npy"), "truncated: 9 bytes", "9-byte file");
  write_bytes(tmp_path("short-header.npy"), buf, 40);
  expect_read_error(tmp_path("short-header.npy"), "lying header length", "file cut in the header");
  write_bytes(tmp_path("short-data.npy"), buf, len - 1);
  expect_read_error(tmp_path("short-data.npy"), "data is truncated", "file cut in the data");
  buf[len] = 0;
  write_bytes(tmp_path("long-data.npy"), buf, len + 1);
  expect_read_error(tmp_path("long-data.npy"), "trailing bytes", "file with an extra byte");
  size_t huge =
      make_file(buf, sizeof buf, 1, 0, "{'descr': '<f4', 'fortran_order': False, 'shape': (65536, 65536, 65536), }", 8);
  write_bytes(tmp_path("huge.npy"), buf, huge);
  expect_read_error(tmp_path("huge.npy"), "needs 1125899906842624 bytes but the file holds 8", "huge shape");
  size_t fo = make_file(buf, sizeof buf, 2, 0, "{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }", 24);
  write_bytes(tmp_path("fortran.npy"), buf, fo);
  expect_read_error(tmp_path("fortran.npy"), "fortran_order True", "fortran file");

  /* Writer: refuses bad arrays and unwritable paths, leaves no file behind. */
  float x[6] = {1, 2, 3, 4, 5, 6};
  char err[400] = "";
  npy_array a = {.dtype = NPY_F4, .ndim = 2, .shape = {2, 3}, .data = x};
  EXPECT(npy_write(tmp_path("no-such-dir/x.npy"), &a, 0, err, sizeof err) == -1 && strstr(err, "cannot create"),
         "unwritable path: '%s'", err);
  a.ndim = 9;
  EXPECT(npy_write(tmp_path("bad.npy"), &a, 0, err, sizeof err) == -1 && strstr(err, "ndim 9"), "ndim 9: '%s'", err);
  a.ndim = 2;
  a.dtype = (npy_dtype)7;
  EXPECT(npy_write(tmp_path("bad.npy"), &a, 0, err, sizeof err) == -1 && strstr(err, "dtype 7"), "dtype 7: '%s'", err);
  a.dtype = NPY_F4;
  EXPECT(npy_write(tmp_path("bad.npy"), &a, 4, err, sizeof err) == -1 && strstr(err, "version 4"), "v4: '%s'", err);
  a.data = NULL;
  EXPECT(npy_write(tmp_path("bad.npy"), &a, 0, err, sizeof err) == -1 && strstr(err, "data is NULL"), "NULL: '%s'",
         err);
  a.shape[0] = -2;
  a.data = x;
  EXPECT(npy_write(tmp_path("bad.npy"), &a, 0, err, sizeof err) == -1 && strstr(err, "shape[0] is -2"), "neg: '%s'",
         err);
  EXPECT(access(tmp_path("bad.npy"), F_OK) != 0, "a refused write left a file behind");
  void *enc;
  size_t enc_len;
  EXPECT(npy_encode(&a, 0, &enc, &enc_len, err, sizeof err) == -1 && enc == NULL, "encode of a bad shape");
}

int main(void) {
  snprintf(tmpdir, sizeof tmpdir, "/tmp/test_npy.XXXXXX");
  if (!mkdtemp(tmpdir)) {
    perror("mkdtemp");
    return 2;
  }
  test_round_trips();
  test_numpy_headers();
  test_malformed();
  test_files();
  const char *names[] = {"round.npy",      "empty.npy",     "short-preamble.npy", "short-header.npy",
                         "short-data.npy", "long-data.npy", "huge.npy",           "fortran.npy"};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) remove(tmp_path(names[i]));
  rmdir(tmpdir);
  if (failures) {
    fprintf(stderr, "test_npy: %d failure(s)\n", failures);
    return 1;
  }
  printf("test_npy: all passed\n");
  return 0;
}
