/* xfer_test.h - hooks for tests and benchmarks (they link libferry.a): the
 * backend behind a device, so they can inject sim faults and read its usage.
 * Nothing in src/ outside xfer/ includes this. */
#ifndef FERRY_XFER_TEST_H
#define FERRY_XFER_TEST_H

#include "gpu/gpu.h"
#include "xfer.h"

fy_gpu *fy_device_gpu(ferry_device *d);

#endif
