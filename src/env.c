/* env.c — the FLASHC_* variables that pick one of a backend's named variants (kernel configurations, dQ modes),
 * read at every call so that a benchmark can switch between calls. One parser for all of them, so that every
 * variable treats an empty value and a typo the same way. */
#include "internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

flashc_status fc_env_choice(const char *var, const char *const *names, int n, int fallback, const char *who, int *out) {
  const char *e = getenv(var);
  *out = fallback;
  if (!e || !*e) return FLASHC_OK;
  char known[256] = "";
  size_t len = 0;
  for (int i = 0; i < n; i++) {
    if (strcmp(e, names[i]) == 0) {
      *out = i;
      return FLASHC_OK;
    }
    const int w = snprintf(known + len, sizeof known - len, "%s%s", i ? ", " : "", names[i]);
    if (w > 0) len = strlen(known); /* snprintf truncates at the buffer's end: a long list is cut, not overrun */
  }
  return fc_error(FLASHC_ERR_INVALID_ARGUMENT, "%s: %s='%.32s' is not one of: %s", who, var, e, known);
}
