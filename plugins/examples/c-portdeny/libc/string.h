/* The part of <string.h> the wit-bindgen C glue uses: implemented in libc.c. */
#pragma once
#include <stddef.h>

void *memcpy(void *dst, const void *src, size_t n);
void *memset(void *dst, int c, size_t n);
size_t strlen(const char *s);
