/* SPDX-License-Identifier: Apache-2.0 */
/* json.h - a strict JSON reader that builds no tree: fy_json_check validates a
 * document once (grammar, nesting depth, number ranges, escapes, duplicate
 * keys in every object), then the fy_json_* cursor calls walk the checked
 * text in place. A DOM took about 21 bytes a header byte (bench/header_mem.py;
 * bench/RESULTS.md, "Header memory"); this keeps one 8-byte slot a key of the
 * objects open at the time. Internal to format/ (and its tests and fuzzers). */
#ifndef FERRY_FORMAT_JSON_H
#define FERRY_FORMAT_JSON_H

#include "common/common.h"

/* As jansson's JSON_PARSER_MAX_DEPTH: a value nested deeper is refused. */
#define FY_JSON_MAX_DEPTH 2048

typedef struct fy_json_info {
    size_t end;     /* one past the document's closing '}' or ']' */
    uint64_t nkeys; /* keys of the outermost object, `skip_key` not counted */
    bool has_skip;  /* the outermost object has `skip_key` */
    /* on FERRY_E_CORRUPT: */
    bool duplicate; /* a key named twice in one object (`key` holds it, decoded) */
    size_t at;      /* offset of the fault */
    char why[80];   /* what is wrong ("'}' expected", "integer out of range", ...) */
    char key[128];  /* the duplicate key, decoded and cut to fit (no NUL inside) */
} fy_json_info;

/* Check that p[0..n) begins with one JSON object or array; bytes after it are
 * not looked at (info->end says where it ended). Exactly as strict as
 * jansson's json_loadb(JSON_REJECT_DUPLICATES | JSON_DISABLE_EOF_CHECK):
 * (stricter in one place: jansson drops a raw NUL byte after a number or
 * literal, this refuses it, as JSON does); whitespace is space, tab, CR, LF;
 * strings refuse raw control characters,
 * unknown escapes, lone surrogates and \u0000; integers must fit int64_t and
 * reals a double; no value deeper than FY_JSON_MAX_DEPTH. The bytes must
 * already be valid UTF-8 (fy_utf8_valid). skip_key (NULL for none): a key of
 * the outermost object not counted in nkeys. Memory: the duplicate-key sets of
 * the open objects, through mem, freed before returning. Returns 0,
 * FERRY_E_CORRUPT (info says why and where), FERRY_E_LIMIT (n >= 4 GiB) or
 * -ENOMEM. */
int fy_json_check(const uint8_t *p, size_t n, const char *skip_key, const ferry_allocator *mem,
                  fy_json_info *info);

/* ---- walking checked text (no errors possible; offsets index p) ---- */

/* The offset of the next byte that is not whitespace. */
size_t fy_json_ws(const uint8_t *p, size_t i);
/* One past the value that starts at i. */
size_t fy_json_skip(const uint8_t *p, size_t i);
/* The string at i (p[i] == '"'): *b, *e bound its raw contents, *esc says whether
 * it holds escapes; returns one past its closing quote. */
size_t fy_json_string(const uint8_t *p, size_t i, size_t *b, size_t *e, bool *esc);
/* Decode raw string contents p[b..e) into out (room for e - b + 1 bytes: no
 * escape grows), NUL-terminated; returns the decoded length. */
size_t fy_json_decode(const uint8_t *p, size_t b, size_t e, char *out);
/* Containers: fy_json_enter at '{' or '[' returns the first element's offset,
 * or 0 when empty; fy_json_next after an element's value returns the next
 * one's, or 0 after the last. An object's element starts at its key:
 * fy_json_member reads the key (as fy_json_string) and returns the value's
 * offset. */
size_t fy_json_enter(const uint8_t *p, size_t i);
size_t fy_json_next(const uint8_t *p, size_t after_value);
size_t fy_json_member(const uint8_t *p, size_t i, size_t *kb, size_t *ke, bool *esc);
/* The integer at i (no fraction, no exponent), or false for anything else. */
bool fy_json_int(const uint8_t *p, size_t i, int64_t *v);

#endif /* FERRY_FORMAT_JSON_H */
