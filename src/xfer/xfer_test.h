/* SPDX-License-Identifier: Apache-2.0 */
/* xfer_test.h - hooks for tests and benchmarks (they link libferry.a): the
 * backend behind a device, so they can inject sim faults and read its usage.
 * Nothing in src/ outside xfer/ includes this. */
#ifndef FERRY_XFER_TEST_H
#define FERRY_XFER_TEST_H

#include "gpu/gpu.h"
#include "xfer.h"

fy_gpu *fy_device_gpu(ferry_device *d);
/* Register file mappings on d in pieces of bytes (a multiple of 4096; 0 puts
 * back REG_PIECE, a whole shard) so small test files straddle pieces.
 * Only while d has nothing registered. */
void fy_device_set_reg_piece(ferry_device *d, uint64_t bytes);
/* auto's sampled page-cache residency of f (xfer_impl.h), 0..1, -1 unknown */
double xf_resident_sampled(const ferry_file *f);

#endif
