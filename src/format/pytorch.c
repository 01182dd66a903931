/* pytorch.c - PyTorch zip checkpoint reader (placeholder until the reader lands). */
#include "format.h"

int fy_pt_parse(const char *name, const uint8_t *buf, uint64_t size, fy_table *tb, fy_err *err)
{
    (void)buf, (void)size, (void)tb;
    return fy_seterr(err, FERRY_E_UNSUPPORTED,
                     "%s: PyTorch zip checkpoints are not supported yet (convert to safetensors)", name);
}
