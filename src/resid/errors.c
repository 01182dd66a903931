/* SPDX-License-Identifier: Apache-2.0 */
/* errors.c - the store's messages: on a model (reaching its store and
 * context), and a failure inside the store or the device passed on to the
 * model. Used by every layer of resid/; uses none. */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "store_impl.h"

int rs_merr(ferry_model *m, int code, const char *fmt, ...)
{
    char body[FY_ERRMSG_MAX], q[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(body, sizeof body, fmt, ap);
    va_end(ap);
    return fy_seterr(&m->err, code, "model %s: %s", RS_Q(q, m->name), body);
}

int rs_model_failed(ferry_model *m, int rc)
{
    char msg[FY_ERRMSG_MAX];
    fy_err_copy(&m->s->err, msg, sizeof msg);
    fy_err_adopt(&m->err, msg);
    return rc;
}

int rs_device_failed(ferry_store *s, ferry_model *m, int rc)
{
    const char *msg = ferry_device_errmsg(s->dev);
    fy_err_adopt(&s->err, msg);
    if (m) fy_err_adopt(&m->err, msg);
    return rc;
}
