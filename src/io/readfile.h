/*
 * readfile.h — opening an input file without blocking. fopen(path, "r") on a FIFO waits for a writer, and
 * on some devices for ever, before the caller can ask what it opened; inputs are opened non-blocking, checked
 * to be regular files with fstat, and only then handed over as a blocking FILE.
 */
#ifndef FLASHC_READFILE_H
#define FLASHC_READFILE_H

#include <stddef.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

/* path opened for reading ("rb") when it is a regular file (links followed). On failure NULL, a reason
 * without the path in why[len] ("cannot open: No such file or directory", "not a regular file (a FIFO)"),
 * and errno: the open's (ENOENT when the file does not exist), or EINVAL for a file that is not regular. */
FILE *io_open_regular(const char *path, char *why, size_t len);

#ifdef __cplusplus
}
#endif
#endif /* FLASHC_READFILE_H */
