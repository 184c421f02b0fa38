/* readfile.c — an input file opened without blocking on what is not a regular file (readfile.h). */
#include "readfile.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *kind_of(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "of an unknown kind";
}

FILE *io_open_regular(const char *path, char *why, size_t len) {
  /* O_NONBLOCK: opening a FIFO for reading then returns at once instead of waiting for a writer. */
  int fd = open(path, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
  if (fd < 0) {
    int saved = errno;
    snprintf(why, len, "cannot open: %s", strerror(saved));
    errno = saved;
    return NULL;
  }
  struct stat st;
  if (fstat(fd, &st) != 0) {
    int saved = errno;
    snprintf(why, len, "cannot stat: %s", strerror(saved));
    close(fd);
    errno = saved;
    return NULL;
  }
  if (!S_ISREG(st.st_mode)) {
    snprintf(why, len, "not a regular file (%s)", kind_of(st.st_mode));
    close(fd);
    errno = EINVAL;
    return NULL;
  }
  /* A regular file never blocks, but reads go on in blocking mode as fopen's would. */
  int flags = fcntl(fd, F_GETFL);
  FILE *f = flags >= 0 && fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) == 0 ? fdopen(fd, "rb") : NULL;
  if (!f) {
    int saved = errno;
    snprintf(why, len, "cannot open: %s", strerror(saved));
    close(fd);
    errno = saved;
  }
  return f;
}
