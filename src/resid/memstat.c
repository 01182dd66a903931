/* memstat.c - see memstat.h */
#include "memstat.h"
