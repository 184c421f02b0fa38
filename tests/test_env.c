/*
 * test_env.c — fc_env_choice (src/env.c), the one parser of the FLASHC_* variables that pick a backend's variant:
 * unset and empty give the fallback, every listed name gives its index, anything else (a typo, a prefix, a
 * different case, a value longer than the message keeps) is FLASHC_ERR_INVALID_ARGUMENT with the known names in
 * the message and the fallback in *out; a list longer than the message buffer is cut, not overrun.
 */
#include "harness.h"
#include "internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const names[] = {"base", "fused", "pipe"};
#define VAR "FLASHC_TEST_ENV_CHOICE"

static void expect_ok(const char *value, int want) {
  if (value)
    setenv(VAR, value, 1);
  else
    unsetenv(VAR);
  int got = -7;
  const flashc_status st = fc_env_choice(VAR, names, 3, 1, "test", &got);
  th_check(st == FLASHC_OK && got == want, "value '%s': status %d, index %d (want ok, %d)", value ? value : "(unset)",
           (int)st, got, want);
}

static void expect_error(const char *value) {
  setenv(VAR, value, 1);
  int got = -7;
  fc_clear_error();
  const flashc_status st = fc_env_choice(VAR, names, 3, 2, "test", &got);
  const char *msg = flashc_last_error();
  th_check(st == FLASHC_ERR_INVALID_ARGUMENT && got == 2, "value '%.40s': status %d, index %d (want invalid, 2)", value,
           (int)st, got);
  th_check(strstr(msg, VAR) && strstr(msg, "base, fused, pipe") && strncmp(msg, "test: ", 6) == 0,
           "value '%.40s': message '%s' names the variable and the known values", value, msg);
}

int main(void) {
  th_begin("test_env");
  expect_ok(NULL, 1);
  expect_ok("", 1);
  for (int i = 0; i < 3; i++) expect_ok(names[i], i);
  expect_error("fuse");
  expect_error("fusedx");
  expect_error("BASE");
  expect_error(" base");
  char longv[600];
  memset(longv, 'x', sizeof longv - 1);
  longv[sizeof longv - 1] = '\0';
  expect_error(longv);

  /* 100 names of 9 characters: the list (about 1 KB) is longer than the message buffer. */
  static char storage[100][10];
  const char *many[100];
  for (int i = 0; i < 100; i++) {
    snprintf(storage[i], sizeof storage[i], "variant%02d", i);
    many[i] = storage[i];
  }
  setenv(VAR, "variant99", 1);
  int got = -1;
  th_check(fc_env_choice(VAR, many, 100, 0, "test", &got) == FLASHC_OK && got == 99, "the last of 100 names: %d", got);
  setenv(VAR, "nope", 1);
  th_check(fc_env_choice(VAR, many, 100, 0, "test", &got) == FLASHC_ERR_INVALID_ARGUMENT && got == 0 &&
               strstr(flashc_last_error(), "variant00, variant01"),
           "an unknown name among 100: %s", flashc_last_error());
  unsetenv(VAR);
  return th_end();
}
