/* SPDX-License-Identifier: Apache-2.0 */
/* cufile.c - the GPUDirect Storage probe: libcufile is loaded with dlopen at
 * run time (never linked), its driver opened and a handle registered for the
 * file to load. Only gpu/ knows CUDA. Without the nvidia-fs kernel module
 * (as on the H200 host it was tried on) the handle registration is refused,
 * so this says why. */
#define _GNU_SOURCE
#include "gpu.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

/* The few cuFile types the probe needs, declared here (no cufile.h at build time). */
typedef struct {
    int err;
    int cu_err;
} cufile_error;
typedef struct {
    int type; /* CU_FILE_HANDLE_TYPE_OPAQUE_FD = 1 */
    union {
        int fd;
        void *handle;
    } handle;
    const void *fs_ops;
} cufile_descr;

static struct {
    cufile_error (*driver_open)(void);
    cufile_error (*handle_register)(void **fh, cufile_descr *d);
    void (*handle_deregister)(void *fh);
    char why[256];
    bool opened;
} cf;
static pthread_once_t cf_once = PTHREAD_ONCE_INIT;

static void cf_load(void)
{
    void *h = dlopen("libcufile.so.0", RTLD_NOW | RTLD_LOCAL);
    if (!h) h = dlopen("libcufile.so", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        snprintf(cf.why, sizeof cf.why, "cannot load libcufile: %s", dlerror());
        return;
    }
    *(void **)&cf.driver_open = dlsym(h, "cuFileDriverOpen");
    *(void **)&cf.handle_register = dlsym(h, "cuFileHandleRegister");
    *(void **)&cf.handle_deregister = dlsym(h, "cuFileHandleDeregister");
    if (!cf.driver_open || !cf.handle_register || !cf.handle_deregister) {
        snprintf(cf.why, sizeof cf.why, "libcufile lacks cuFileDriverOpen/cuFileHandleRegister");
        return;
    }
    cufile_error e = cf.driver_open();
    if (e.err != 0) {
        snprintf(cf.why, sizeof cf.why, "cuFileDriverOpen failed (cuFile error %d, CUDA error %d)", e.err,
                 e.cu_err);
        return;
    }
    cf.opened = true;
}

int fy_cufile_probe(fy_gpu *g, int fd, char *why, size_t n)
{
    if (strcmp(g->ops->name, "cuda") != 0) { /* only gpu/ tells its backends apart */
        snprintf(why, n, "GPUDirect Storage needs a cuda device, not %s", g->desc);
        return FERRY_E_NODEV;
    }
    pthread_once(&cf_once, cf_load);
    if (!cf.opened) {
        snprintf(why, n, "%s", cf.why);
        return FERRY_E_NODEV;
    }
    if (fd < 0) {
        snprintf(why, n, "cuFile's driver opened (no file asked about)");
        return 0;
    }
    cufile_descr d;
    memset(&d, 0, sizeof d);
    d.type = 1;
    d.handle.fd = fd;
    void *fh = NULL;
    cufile_error e = cf.handle_register(&fh, &d);
    if (e.err != 0) {
        snprintf(why, n,
                 "cuFileHandleRegister refused the file (cuFile error %d, CUDA error %d; no nvidia-fs?)",
                 e.err, e.cu_err);
        return FERRY_E_NODEV;
    }
    cf.handle_deregister(fh);
    snprintf(why, n, "cuFile accepted the file");
    return 0;
}
