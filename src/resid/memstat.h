/* temporary: removed at merge (the header moved to io/memstat.h; store.c still includes it here) */
#include "../io/memstat.h"
