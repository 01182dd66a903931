/* SPDX-License-Identifier: Apache-2.0 */
/* index.c - a sharded safetensors checkpoint's *.safetensors.index.json:
 * {"metadata": {...}, "weight_map": {"tensor name": "shard file", ...}}. */
#include "format.h"

#include <errno.h>
#include <string.h>

#include <jansson.h>

#define Q(buf, s) fy_quote((buf), sizeof(buf), (s))

void fy_index_free(fy_index *ix)
{
    if (!ix->mem) return;
    for (int64_t i = 0; i < ix->n; i++) fy_free(ix->mem, ix->names[i]);
    for (int32_t i = 0; i < ix->nfiles; i++) fy_free(ix->mem, ix->files[i]);
    fy_free(ix->mem, ix->names);
    fy_free(ix->mem, ix->shard_of);
    fy_free(ix->mem, ix->files);
    const ferry_allocator *m = ix->mem;
    memset(ix, 0, sizeof *ix);
    ix->mem = m;
}

/* A shard name must stay inside the index's folder. */
static bool safe_relpath(const char *p)
{
    if (!*p || p[0] == '/') return false;
    for (const char *c = p; *c; c++)
        if ((unsigned char)*c < 0x20 || *c == 0x7F)
            return false; /* messages name shards: keep them one line */
    for (const char *s = p; *s;) {
        const char *e = strchr(s, '/');
        size_t len = e ? (size_t)(e - s) : strlen(s);
        if (len == 2 && s[0] == '.' && s[1] == '.') return false;
        if (!e) break;
        s = e + 1;
    }
    return true;
}

char *fy_json_text(const ferry_allocator *mem, const json_t *v, size_t flags, size_t *len)
{
    size_t n = json_dumpb(v, NULL, 0, flags); /* 0: its loop check ran out of memory */
    char *text = n ? fy_malloc(mem, n + 1) : NULL;
    if (!text) return NULL;
    if (json_dumpb(v, text, n, flags) != n) {
        fy_free(mem, text);
        return NULL;
    }
    text[n] = '\0';
    *len = n;
    return text;
}

int fy_index_parse(const char *name, const uint8_t *buf, size_t n, fy_index *ix, fy_table *meta, fy_err *err)
{
    char q1[128], q2[128];
    json_error_t je;
    int rc = 0;
    json_t *seen = json_object();
    const ferry_allocator *mem = ix->mem;
    json_t *root = json_loadb((const char *)buf, n, JSON_REJECT_DUPLICATES, &je);
    if (!root || !seen) {
        json_decref(seen);
        if (!root && json_error_code(&je) == json_error_out_of_memory)
            return fy_seterr(err, -ENOMEM, "%s: out of memory", name);
        if (root) {
            json_decref(root);
            return fy_seterr(err, -ENOMEM, "%s: out of memory", name);
        }
        return fy_seterr(err, FERRY_E_CORRUPT, "%s: not valid JSON: %s (line %d, column %d)", name, je.text,
                         je.line, je.column);
    }
    json_t *wm = json_object_get(root, "weight_map");
    if (!json_is_object(root) || !json_is_object(wm)) {
        rc = fy_seterr(err, FERRY_E_CORRUPT, "%s: no \"weight_map\" object: not a safetensors index", name);
        goto out;
    }
    json_t *md = json_object_get(root, "metadata");
    if (md && !json_is_null(md)) {
        if (!json_is_object(md)) {
            rc = fy_seterr(err, FERRY_E_CORRUPT, "%s: \"metadata\" is not an object", name);
            goto out;
        }
        const char *k;
        size_t klen;
        json_t *v;
        json_object_keylen_foreach(md, k, klen, v)
        {
            char *text = NULL;
            const char *val;
            size_t vlen;
            ferry_meta_kind kind = json_is_string(v) ? FERRY_META_TEXT : FERRY_META_JSON;
            if (json_is_string(v)) {
                val = json_string_value(v);
                vlen = json_string_length(v);
            } else {
                text = fy_json_text(mem, v, JSON_ENCODE_ANY | JSON_COMPACT, &vlen);
                if (!text) {
                    rc = fy_seterr(err, -ENOMEM, "%s: out of memory", name);
                    goto out;
                }
                val = text;
            }
            rc = fy_table_push_meta(meta, k, klen, val, vlen, kind);
            fy_free(mem, text);
            if (rc < 0) {
                fy_seterr(err, rc, "%s: out of memory", name);
                goto out;
            }
        }
    }
    size_t cnt = json_object_size(wm);
    ix->names = fy_calloc(mem, cnt ? cnt : 1, sizeof(char *));
    ix->shard_of = fy_calloc(mem, cnt ? cnt : 1, sizeof(int32_t));
    ix->files = fy_calloc(mem, cnt ? cnt : 1, sizeof(char *));
    if (!ix->names || !ix->shard_of || !ix->files) {
        rc = fy_seterr(err, -ENOMEM, "%s: out of memory", name);
        goto out;
    }
    const char *k;
    size_t klen;
    json_t *v;
    json_object_keylen_foreach(wm, k, klen, v)
    {
        if (!json_is_string(v)) {
            rc = fy_seterr(err, FERRY_E_CORRUPT, "%s: weight_map[%s] is not a file name", name, Q(q1, k));
            goto out;
        }
        const char *file = json_string_value(v);
        if (!safe_relpath(file)) {
            rc = fy_seterr(err, FERRY_E_CORRUPT,
                           "%s: weight_map[%s] = %s: shard files must be relative paths inside the index's "
                           "folder, without control characters",
                           name, Q(q1, k), Q(q2, file));
            goto out;
        }
        /* seen: file -> shard number, a hash table so hostile indexes stay linear */
        json_t *known = json_object_get(seen, file);
        int32_t s;
        if (known) {
            s = (int32_t)json_integer_value(known);
        } else {
            s = ix->nfiles;
            ix->files[s] = fy_strndup(mem, file, strlen(file));
            if (!ix->files[s]) {
                rc = fy_seterr(err, -ENOMEM, "%s: out of memory", name);
                goto out;
            }
            ix->nfiles++; /* owned by ix from here, freed on any later failure */
            if (json_object_set_new(seen, file, json_integer(s)) < 0) {
                rc = fy_seterr(err, -ENOMEM, "%s: out of memory", name);
                goto out;
            }
        }
        ix->names[ix->n] = fy_strndup(mem, k, klen);
        if (!ix->names[ix->n]) {
            rc = fy_seterr(err, -ENOMEM, "%s: out of memory", name);
            goto out;
        }
        ix->shard_of[ix->n] = s;
        ix->n++;
    }
    if (ix->n == 0) rc = fy_seterr(err, FERRY_E_CORRUPT, "%s: weight_map is empty", name);
out:
    json_decref(seen);
    json_decref(root);
    if (rc < 0) fy_index_free(ix);
    return rc;
}
