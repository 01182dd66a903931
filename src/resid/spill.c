/* spill.c - see spill.h */
#include "spill.h"
