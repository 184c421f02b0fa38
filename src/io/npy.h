/*
 * npy.h — read and write NumPy .npy files: little-endian float arrays (f2, f4, f8) and boolean arrays (b1, for
 * attention masks) in C order.
 *
 * The format (numpy.lib.format): the magic "\x93NUMPY", a major and a minor version byte, the header
 * length (u16 little-endian for version 1.0, u32 for 2.0 and 3.0), then the header: a Python dict literal
 *   {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }
 * padded with spaces and ended by '\n' (latin-1 in 1.0/2.0, utf-8 in 3.0), then the raw data.
 *
 * The reader is strict and bounded: anything it cannot read exactly (a truncated file, a lying header
 * length, a shape whose byte count overflows or disagrees with the data, Fortran order, a big-endian or
 * dtype other than these, an absurd header) is an error with a message that names the offending value, and no
 * data buffer is allocated before the data is known to be there. Not part of libflashc's public API: the
 * CLI, the tests and the fuzzer use it.
 */
#ifndef FLASHC_NPY_H
#define FLASHC_NPY_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define NPY_MAX_DIMS 8
/* numpy itself refuses headers above 10000 bytes by default; ours are ~128. */
#define NPY_MAX_HEADER_LEN 65536u

typedef enum npy_dtype {
  NPY_F2 = 0, /* '<f2': IEEE half */
  NPY_F4 = 1, /* '<f4': float     */
  NPY_F8 = 2, /* '<f8': double    */
  NPY_B1 = 3  /* '|b1': bool, one byte each; the bytes are kept as they are (numpy reads nonzero as True) */
} npy_dtype;

/* Bytes per element (2, 4, 8, 1); 0 for an unknown value. */
size_t npy_dtype_size(npy_dtype dtype);
/* "<f2", "<f4", "<f8", "|b1"; NULL for an unknown value. */
const char *npy_dtype_descr(npy_dtype dtype);

/* An array read from a file, or described for writing. `data` is C order, little-endian values converted
 * to host order. */
typedef struct npy_array {
  npy_dtype dtype;
  int ndim; /* 0 .. NPY_MAX_DIMS; 0 is a scalar (one element) */
  int64_t shape[NPY_MAX_DIMS];
  int64_t count; /* product of shape */
  void *data;    /* reader: malloc'd (never NULL on success, even for count 0); free with npy_free */
} npy_array;

/* Results: 0 on success, -1 on failure with a message in err[errlen] (which may be NULL). On failure the
 * array is left zeroed and holds no memory. */

/* Parses a whole .npy file held in memory (buf may be NULL when len is 0). */
int npy_parse(const void *buf, size_t len, npy_array *out, char *err, size_t errlen);
/* Reads a .npy file. */
int npy_read(const char *path, npy_array *out, char *err, size_t errlen);
/* Frees a reader's data and zeroes the array. NULL is fine. */
void npy_free(npy_array *a);

/* Encodes an array (dtype, ndim, shape, data; count is ignored and recomputed) as a .npy file in a fresh
 * malloc'd buffer. version_major: 1, 2 or 3, or 0 for the smallest that fits (always 1 for our shapes). */
int npy_encode(const npy_array *a, int version_major, void **buf, size_t *len, char *err, size_t errlen);
/* Writes an array to a .npy file (version 0 = the smallest that fits), replacing it. */
int npy_write(const char *path, const npy_array *a, int version_major, char *err, size_t errlen);

/* "(2, 3)" for messages; returns out. */
const char *npy_shape_string(int ndim, const int64_t *shape, char *out, size_t len);

#ifdef __cplusplus
}
#endif
#endif /* FLASHC_NPY_H */
