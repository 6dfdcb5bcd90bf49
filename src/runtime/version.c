/*
 * version.c - the version the library was built with, asked at run time.
 *
 * ATTN_VERSION_STRING tells a program which header it was compiled against;
 * attn_version() tells it which library it is running on, so a program linked
 * against libattn.so can compare the two (as zlib's zlibVersion and libuv's
 * uv_version_string do).
 */
#include "attn.h"

const char *attn_version(void)
{
    return ATTN_VERSION_STRING;
}
