/* flash.h — what the `cpu` backend's forward (flash.c) and backward (flash_bwd.c) share. */
#ifndef FLASHC_CPU_FLASH_H
#define FLASHC_CPU_FLASH_H

#include "../internal.h"

/* Scores are kept in base 2: S = (scale·log2 e) q·k, so softmax's e^x becomes 2^x (one exp2 per score). */
#define FC_LOG2E 1.4426950408889634f
#define FC_LN2   0.6931471805599453f

/* dq, dk, dv of FlashAttention-2 (flash_bwd.c). */
flashc_status fc_cpu_flash_backward(const fc_problem *p);

#endif /* FLASHC_CPU_FLASH_H */
