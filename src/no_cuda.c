/* no_cuda.c — what the CUDA runtime part provides, for builds without it: every pointer is host memory
 * and there is no device workspace. */
#include "internal.h"

int fc_pointer_is_device(const void *ptr) {
  (void)ptr;
  return 0;
}

flashc_status fc_device_workspace(const fc_problem *p, size_t bytes, void **ptr) {
  (void)p;
  (void)bytes;
  *ptr = NULL;
  return fc_error(FLASHC_ERR_UNSUPPORTED, "this libflashc was built without CUDA");
}

void fc_device_workspace_free(struct flashc_handle_s *h) { (void)h; }

flashc_status fc_device_stream_switch(struct flashc_handle_s *h, void *old_stream, void *new_stream) {
  (void)h;
  (void)old_stream;
  (void)new_stream;
  return FLASHC_OK;
}

flashc_status fc_device_zero_rows(const fc_problem *p, void *data, const int64_t n[3], const int64_t stride[3],
                                  int64_t row) {
  (void)p;
  (void)data;
  (void)n;
  (void)stride;
  (void)row;
  return fc_error(FLASHC_ERR_UNSUPPORTED, "this libflashc was built without CUDA");
}

flashc_status fc_device_fill_f32(const fc_problem *p, float *data, int64_t n, float value) {
  (void)p;
  (void)data;
  (void)n;
  (void)value;
  return fc_error(FLASHC_ERR_UNSUPPORTED, "this libflashc was built without CUDA");
}

flashc_status fc_device_unused_rows(const fc_problem *p) {
  (void)p;
  return fc_error(FLASHC_ERR_UNSUPPORTED, "this libflashc was built without CUDA");
}

flashc_status fc_device_dropout_mask(const fc_problem *p) {
  (void)p;
  return fc_error(FLASHC_ERR_UNSUPPORTED, "this libflashc was built without CUDA");
}
