/* hopper/tma.cuh — the host side of cuda-hopper's TMA, shared by the forward (hopper/fwd.cu) and the backward
 * (hopper/bwd.cu): whether a view can be addressed by the copy engine, and its tensor map. */
#ifndef FLASHC_CUDA_HOPPER_TMA_CUH
#define FLASHC_CUDA_HOPPER_TMA_CUH

#include "common/common.cuh"

#include <cuda.h> /* CUtensorMap (a type only: no driver call is linked) */

/* The head dim D a call runs as: d ≤ 64 as 64, d ≤ 128 as 128, d ≤ 256 as 256 (the copy engine fills the columns past
 * d with zeros). */
static inline int fc_hp_d_tile(int64_t head_dim) { return head_dim <= 64 ? 64 : head_dim <= 128 ? 128 : 256; }

/* The 4-d shape of a [b, s, h, d] view for TMA: dims (head_dim, rows, heads, batch), innermost first. A dim of
 * size 1 gets a stride that TMA accepts (its coordinate is always 0). */
typedef struct fc_hp_map_shape {
  int64_t size[4];   /* elements: head_dim, rows, heads, batch */
  int64_t stride[4]; /* elements; stride[0] = 1 */
} fc_hp_map_shape;

/* q, o, dout (is_q: rows of the query side) or k, v; v, o and dout (p's own views) have head_dim_v columns. */
fc_hp_map_shape fc_hp_shape(const fc_problem *p, const fc_view *v, bool is_q);

/* Can TMA address this view? 16-byte aligned base, strides of multiples of 16 bytes below 2^40, sizes that fit
 * its 32-bit coordinates. FLASHC_ERR_UNSUPPORTED with a message naming `name` and the dim otherwise. */
flashc_status fc_hp_check_view(const fc_problem *p, const fc_view *v, bool is_q, const char *name);

/* The map of a view that fc_hp_check_view accepted: boxes of 64 columns × box_rows rows of one head, 128-byte
 * swizzle, zeros outside. `op` ("flashc_forward", "flashc_backward") starts the message of a failure. */
flashc_status fc_hp_encode_box(const fc_problem *p, const fc_view *v, bool is_q, const char *name, int box_rows,
                               const char *op, CUtensorMap *map);

/* seqused (flashc.h): the rows past a sequence's used ones are the caller's, possibly NaN or Inf, and a box of the
 * call's maps that runs past them brings them into a wgmma, where a masked score's P = 0 times NaN is NaN. Under
 * seqused the kernels load each sequence through maps of its own instead: map 4b + 0 for q's rows of sequence b, 1
 * k's, 2 v's, 3 dout's (the backward; q's again in the forward, unused), each the packed tensor cut after the
 * sequence's last used row (at least one row: a sequence with none is never loaded), so that the coordinates stay
 * the call maps' and the copy engine fills every row past the used ones with zeros, as it does past the end of a
 * tensor. (Rows before the sequence are the previous one's; the kernels load none that a product needs: only the
 * forward's query rows before a sequence under align_end, never stored and multiplied into their own rows only.)
 * Encoded on the host (q, dout with boxes of q_box rows, k, v with k_box) and copied on the call's stream to `ws` +
 * `at` (fc_hp_seq_maps_bytes of device memory, 64-byte aligned): *at_int = at, the kernels' argument (an int in their
 * argument structs' padding, which leaves the plain kernels' parameters where they were: a pointer added to them
 * shifted the offsets of the parameters after it, and ptxas then spilled 4 bytes in the plain persistent forward at
 * D = 128). The kernels fence each map before their first copy through it (fc_tma_acquire_map). 0 bytes, *at_int =
 * 0 and nothing to do without seqused. */
size_t fc_hp_seq_maps_bytes(const fc_problem *p);
flashc_status fc_hp_seq_maps(const fc_problem *p, int q_box, int k_box, const char *op, void *ws, size_t at,
                             int *at_int);

#endif /* FLASHC_CUDA_HOPPER_TMA_CUH */
