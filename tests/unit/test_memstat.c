/* test_memstat.c */
#include "check.h"
int main(void) { return 77; }
