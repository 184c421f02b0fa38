/* error.c — statuses in words and the per-thread last-error message. */
#include "internal.h"

#include <stdarg.h>
#include <stdio.h>

static _Thread_local char last_error[512];

const char *flashc_status_string(flashc_status status) {
  switch (status) {
  case FLASHC_OK: return "ok";
  case FLASHC_ERR_INVALID_ARGUMENT: return "invalid argument";
  case FLASHC_ERR_UNSUPPORTED: return "unsupported";
  case FLASHC_ERR_OUT_OF_MEMORY: return "out of memory";
  case FLASHC_ERR_CUDA: return "CUDA error";
  case FLASHC_ERR_COMMUNICATION: return "communication error";
  case FLASHC_ERR_INTERNAL: return "internal error";
  case FLASHC_STATUS_COUNT: break;
  }
  return "unknown status";
}

const char *flashc_last_error(void) { return last_error; }

void fc_clear_error(void) { last_error[0] = '\0'; }

flashc_status fc_error(flashc_status status, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(last_error, sizeof last_error, fmt, ap);
  va_end(ap);
  return status;
}
