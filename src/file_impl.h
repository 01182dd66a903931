/* temporary: removed at merge (the header moved to file/file_impl.h; xfer.c and store.c still include it here) */
#include "file/file_impl.h"
