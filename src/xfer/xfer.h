/* xfer.h - internal hooks of the transfer engine for tests (not exported by
 * libferry.so; the tests link libferry.a). */
#ifndef FERRY_XFER_H
#define FERRY_XFER_H

#include "../gpu/gpu.h"

/* The backend behind a device: tests inject sim faults and read its usage. */
fy_gpu *fy_device_gpu(ferry_device *d);

#endif
