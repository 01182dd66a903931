/* check.h - a minimal test harness: CHECK counts, never aborts, summary at the end. */
#ifndef FERRY_CHECK_H
#define FERRY_CHECK_H
#include <stdio.h>
#include <string.h>

static int check_pass, check_fail;

#define CHECK(cond)                                                              \
    do {                                                                         \
        if (cond) check_pass++;                                                  \
        else {                                                                   \
            check_fail++;                                                        \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
        }                                                                        \
    } while (0)
#define CHECK_EQ(a, b)                                                           \
    do {                                                                         \
        long long a_ = (long long)(a), b_ = (long long)(b);                      \
        if (a_ == b_) check_pass++;                                              \
        else {                                                                   \
            check_fail++;                                                        \
            fprintf(stderr, "%s:%d: CHECK failed: %s == %s (%lld != %lld)\n", __FILE__, __LINE__, #a, #b, a_, b_); \
        }                                                                        \
    } while (0)
#define CHECK_STR_HAS(s, sub)                                                    \
    do {                                                                         \
        const char *s_ = (s);                                                    \
        if (s_ && strstr(s_, (sub))) check_pass++;                               \
        else {                                                                   \
            check_fail++;                                                        \
            fprintf(stderr, "%s:%d: CHECK failed: \"%s\" does not contain \"%s\"\n", __FILE__, __LINE__, s_ ? s_ : "(null)", (sub)); \
        }                                                                        \
    } while (0)

static int check_summary(void)
{
    printf("%d passed, %d failed\n", check_pass, check_fail);
    return check_fail ? 1 : 0;
}
#endif
