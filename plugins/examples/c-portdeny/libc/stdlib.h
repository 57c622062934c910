/* The part of <stdlib.h> the wit-bindgen C glue uses (no libc in a -nostdlib wasm32 guest):
 * implemented in libc.c. */
#pragma once
#include <stddef.h>

void *malloc(size_t n);
void *realloc(void *ptr, size_t n);
void free(void *ptr);
_Noreturn void abort(void);
