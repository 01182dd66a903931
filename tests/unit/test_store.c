/* test_store.c */
#include "check.h"
int main(void) { return 77; }
