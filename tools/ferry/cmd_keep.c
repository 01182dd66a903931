/* SPDX-License-Identifier: Apache-2.0 */
/* cmd_keep.c - `ferry keep`: run the keeper in the foreground, or ask a
 * running one what it holds (--status). */
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "ferry_experimental.h"

static int run(int argc, char **argv);

const cli_cmd cmd_keep = {
    "keep", "hold tensor bytes in shareable memory across client restarts (experimental)",
    "usage: ferry keep [--socket PATH] [--device DEV] [--budget SIZE]\n"
    "       ferry keep --status [--socket PATH] [--json]\n"
    "\n"
    "Run the keeper in the foreground: a daemon that holds tensors' bytes in\n"
    "memory that outlives the programs that load them, and hands that memory to\n"
    "them by passing file descriptors over a Unix socket. A program that restarts\n"
    "gets its weights back from the keeper instead of reading its checkpoints\n"
    "again. The keeper holds and hands out; it never computes. Each entry is one\n"
    "tensor of one checkpoint file as its client saw the file (size, mtime and a\n"
    "digest of its header): a file that changed is a miss, never stale bytes.\n"
    "When a new entry needs room the least recently used ones go first; an entry\n"
    "a client has attached right now is never dropped for room.\n"
    "\n"
    "Only its own user may connect: the socket lives in a private directory\n"
    "(made 0700; refused when it belongs to another user or is open to others),\n"
    "and each connection's peer uid is checked. Logs go to stderr; SIGTERM or\n"
    "SIGINT stop it, removing the socket and freeing everything. A keeper that\n"
    "dies loses only its cache. Experimental: the protocol and API may change\n"
    "(docs/KEEPER.md).\n"
    "\n"
    "options:\n"
    "  --socket PATH  the socket (default $XDG_RUNTIME_DIR/ferry/keep.sock, else\n"
    "                 /tmp/ferry-keep-UID/keep.sock)\n"
    "  --device DEV   where the memory comes from: sim (memfd host memory, the\n"
    "                 default) or sim:SIZE (SIZE is also the budget). cuda:N is\n"
    "                 not built yet\n"
    "  --budget SIZE  the most bytes held (e.g. 32GiB; default: sim's SIZE, else\n"
    "                 half the host's available memory); never above the host's\n"
    "                 available memory (cgroup-aware)\n"
    "  --status       print what a running keeper holds and who is attached\n"
    "  --json         with --status: print {\"socket\", \"device\", \"budget\",\n"
    "                 \"used\", \"pending_bytes\", \"entries\": N, \"pending\": N,\n"
    "                 \"clients\": [{\"pid\", \"uid\", \"attached\", \"pending\"}],\n"
    "                 \"listed\": [{\"id\", \"path\", \"tensor\", \"index\", \"nbytes\",\n"
    "                 \"attached\", \"file_size\", \"mtime_ns\", \"header_digest\": HEX,\n"
    "                 \"idle_ms\"}]} (listed: as many entries as fit one reply)\n"
    "  -h, --help     show this help\n"
    "\n"
    "Exit status: 0 clean stop (or status printed), 1 failure (no keeper there,\n"
    "a refused socket directory, ...), 2 usage error.\n",
    run};

static int status(const char *sock, bool json)
{
    char err[1400], path[256];
    if (!sock) {
        if (ferry_keep_default_socket(path, sizeof path) < 0) {
            fprintf(stderr, "ferry keep: the default socket path is too long: give --socket PATH\n");
            return EXIT_FAIL;
        }
        sock = path;
    }
    ferry_keep *k;
    if (ferry_keep_connect(sock, 5000, &k, err, sizeof err) < 0) {
        fprintf(stderr, "%s\n", err);
        return EXIT_FAIL;
    }
    ferry_keep_status *s;
    if (ferry_keep_status_get(k, &s) < 0) {
        fprintf(stderr, "%s\n", ferry_keep_errmsg(k));
        ferry_keep_close(k);
        return EXIT_FAIL;
    }
    int ex = EXIT_OK;
    if (json) {
        json_t *o = json_object();
        json_object_set_new(o, "socket", json_string(sock));
        json_object_set_new(o, "device", json_string(s->device));
        json_object_set_new(o, "budget", json_integer((json_int_t)s->budget));
        json_object_set_new(o, "used", json_integer((json_int_t)s->used));
        json_object_set_new(o, "pending_bytes", json_integer((json_int_t)s->pending_bytes));
        json_object_set_new(o, "entries", json_integer(s->nentries));
        json_object_set_new(o, "pending", json_integer(s->npending));
        json_t *cl = json_array();
        for (uint32_t i = 0; i < s->listed_clients; i++) {
            const ferry_keep_client_info *c = &s->clients[i];
            json_array_append_new(cl, json_pack("{s:i,s:I,s:I,s:I}", "pid", (int)c->pid, "uid",
                                                (json_int_t)c->uid, "attached", (json_int_t)c->attached,
                                                "pending", (json_int_t)c->pending));
        }
        json_object_set_new(o, "clients", cl);
        json_t *el = json_array();
        for (uint32_t i = 0; i < s->listed_entries; i++) {
            const ferry_keep_entry_info *e = &s->entries[i];
            char hex[17];
            snprintf(hex, sizeof hex, "%016" PRIx64, e->header_digest);
            json_array_append_new(
                el, json_pack("{s:I,s:s,s:s,s:I,s:I,s:I,s:I,s:I,s:s,s:I}", "id", (json_int_t)e->id, "path",
                              e->path, "tensor", e->tensor, "index", (json_int_t)e->index, "nbytes",
                              (json_int_t)e->nbytes, "attached", (json_int_t)e->attached, "file_size",
                              (json_int_t)e->file_size, "mtime_ns", (json_int_t)e->mtime_ns, "header_digest",
                              hex, "idle_ms", (json_int_t)e->idle_ms));
        }
        json_object_set_new(o, "listed", el);
        if (json_dumpf(o, stdout, JSON_INDENT(2) | JSON_PRESERVE_ORDER) < 0)
            ex = cli_fail("writing JSON failed");
        else printf("\n");
        json_decref(o);
    } else {
        char b1[32], b2[32], b3[32];
        printf("keeper on %s: device %s, budget %s, holding %s in %u %s", sock, s->device,
               cli_human(b1, sizeof b1, s->budget), cli_human(b2, sizeof b2, s->used - s->pending_bytes),
               s->nentries, cli_plural(s->nentries, "entry", "entries"));
        if (s->npending)
            printf(" (+ %s in %u unfinished %s)", cli_human(b3, sizeof b3, s->pending_bytes), s->npending,
                   cli_plural(s->npending, "put", "puts"));
        printf("\n");
        /* the status connection itself is one of the clients */
        printf("%u %s connected (this one included):\n", s->listed_clients,
               cli_plural(s->listed_clients, "client", "clients"));
        for (uint32_t i = 0; i < s->listed_clients; i++) {
            const ferry_keep_client_info *c = &s->clients[i];
            printf("  pid %d uid %u: %u attached, %u unfinished\n", (int)c->pid, (unsigned)c->uid,
                   c->attached, c->pending);
        }
        if (s->listed_entries) printf("entries (most recently made first):\n");
        for (uint32_t i = 0; i < s->listed_entries; i++) {
            const ferry_keep_entry_info *e = &s->entries[i];
            char name[64];
            if (!e->tensor[0]) snprintf(name, sizeof name, "#%u", e->index);
            printf("  %10s  %s  %s  idle %.1f s%s\n", cli_human(b1, sizeof b1, e->nbytes), e->path,
                   e->tensor[0] ? e->tensor : name, (double)e->idle_ms / 1e3,
                   e->attached ? "  attached" : "");
        }
        if (s->listed_entries < s->nentries) printf("  ... and %u more\n", s->nentries - s->listed_entries);
    }
    ferry_keep_status_free(s);
    ferry_keep_close(k);
    return ex;
}

static int run(int argc, char **argv)
{
    const char *sock = NULL, *device = NULL;
    uint64_t budget = 0;
    bool want_status = false, json = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (cli_is_help(a)) return cli_help(&cmd_keep);
        else if (strcmp(a, "--status") == 0) want_status = true;
        else if (strcmp(a, "--json") == 0) json = true;
        else if (strcmp(a, "--socket") == 0 || strcmp(a, "--device") == 0 || strcmp(a, "--budget") == 0) {
            if (!v) return cli_usage_error(&cmd_keep, "%s needs a value", a);
            if (a[2] == 's') sock = v;
            else if (a[2] == 'd') device = v;
            else if (!cli_parse_size(v, &budget) || budget == 0)
                return cli_usage_error(&cmd_keep,
                                       "--budget needs a size above 0 (4096, 64MiB, 32GiB), not '%s'", v);
            i++;
        } else if (a[0] == '-') return cli_usage_error(&cmd_keep, "unknown option '%s'", a);
        else return cli_usage_error(&cmd_keep, "unexpected argument '%s'", a);
    }
    if (want_status) {
        if (device || budget) return cli_usage_error(&cmd_keep, "--status takes only --socket and --json");
        return status(sock, json);
    }
    if (json) return cli_usage_error(&cmd_keep, "--json goes with --status");
    ferry_keep_opts o = {
        .socket = sock, .device = device, .budget = budget, .stop_fd = -1, .handle_signals = 1};
    char err[1400];
    int rc = ferry_keep_serve(&o, err, sizeof err);
    if (rc < 0) {
        fprintf(stderr, "ferry keep: %s\n", err);
        return EXIT_FAIL;
    }
    return EXIT_OK;
}
