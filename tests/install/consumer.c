/* SPDX-License-Identifier: Apache-2.0 */
/* consumer.c - a user's program built against an installed libferry
 * (tests/install/run_install_test.sh): prints the version its header says and
 * the one the library it runs with reports, and fails when they differ. */
#include <ferry.h>
#include <stdio.h>
#include <string.h>

int main(void)
{
    printf("header %s library %s\n", FERRY_VERSION_STRING, ferry_version_string());
    if (strcmp(FERRY_VERSION_STRING, ferry_version_string()) != 0 ||
        ferry_version() != FERRY_VERSION_NUMBER) {
        fprintf(stderr, "consumer: header version %s, library version %s\n", FERRY_VERSION_STRING,
                ferry_version_string());
        return 1;
    }
    return 0;
}
