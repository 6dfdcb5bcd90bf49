/*
 * text_cursor.h - one reader for the two text headers attn parses: the Python dict
 * literal at the head of a .npy file and the JSON object at the head of a
 * .safetensors file. Not installed.
 *
 * Both parsers walk their header with the same few steps (skip whitespace, expect a
 * character, read a quoted string, read an integer, read a literal such as True or
 * null) and report a problem the same way, "PATH: bad <format> header: PROBLEM at
 * byte N of the header". Putting the steps in one place makes the two formats refuse
 * the same things for the same reasons:
 *
 *   - whitespace is space, tab, line feed and carriage return (JSON's set; Python
 *     also allows form feeds and comments, which no writer puts in a header);
 *   - an integer is plain decimal digits without a sign, and without a leading zero
 *     unless it is 0 itself: JSON forbids "01" and Python forbids it as well (Python
 *     would take "00", "0x10" and "1_0"; numpy never writes them, so they are
 *     refused here as one rule for both formats); a number larger than the caller's
 *     maximum is an OVERFLOW error naming the maximum;
 *   - a string is quoted with '"' (JSON) or with '\'' or '"' (Python), its escapes
 *     are decoded by the dialect's rules, and the result is UTF-8. A string may not
 *     hold a control character (JSON) or a line break (Python). When the header's
 *     encoding is UTF-8 (.safetensors, .npy version 3.0) a string whose bytes are
 *     not valid UTF-8 is refused, as Python's readers refuse such a header; in a
 *     latin-1 header (.npy versions 1.0 and 2.0) each byte is one character.
 *
 * The cursor never reads past its n bytes and never allocates except in
 * attn__cursor_string_alloc.
 */
#ifndef ATTN_TEXT_CURSOR_H
#define ATTN_TEXT_CURSOR_H

#include "attn_internal.h"

#include <stddef.h>
#include <stdint.h>

typedef enum attn__syntax {
    ATTN__SYNTAX_PYTHON, /* a Python literal: 'str' or "str", True/False/None */
    ATTN__SYNTAX_JSON    /* JSON (RFC 8259): "str", true/false/null */
} attn__syntax;

/* The literals of both dialects, by meaning. */
typedef enum attn__literal {
    ATTN__LITERAL_NONE = -1, /* the text here is not a literal */
    ATTN__LITERAL_FALSE = 0,
    ATTN__LITERAL_TRUE = 1,
    ATTN__LITERAL_NULL = 2
} attn__literal;

typedef struct attn__cursor {
    attn_ctx *ctx;
    const char *path;   /* the file, first in every message */
    const char *header; /* what is being read, e.g. "bad .npy header" */
    attn__syntax syntax;
    int utf8;           /* the text is UTF-8 (else latin-1: one byte, one character) */
    int long_suffix;    /* Python 2's 'L' after an integer is allowed (old .npy files) */
    const unsigned char *s;
    size_t n; /* bytes in s */
    size_t i; /* the next byte to read: the position every message reports */
} attn__cursor;

/* Starts a cursor at byte 0 of s[0..n). path and header label its messages. */
void attn__cursor_init(attn__cursor *c, attn_ctx *ctx, const char *path,
                       const char *header, attn__syntax syntax, int utf8, const void *s,
                       size_t n);

/* Records ATTN_STATUS_FORMAT with "PATH: HEADER: PROBLEM at byte I of the header" and
 * returns it. */
int attn__cursor_fail(attn__cursor *c, const char *fmt, ...) ATTN__PRINTF(2, 3);

/* Skips whitespace and returns the next byte, or -1 at the end. Consumes nothing
 * else. */
int attn__cursor_peek(attn__cursor *c);
/* Skips whitespace; if the next byte is ch, consumes it and returns 1, else 0. */
int attn__cursor_accept(attn__cursor *c, int ch);
/* Like accept, but a missing ch is an error "expected 'ch'". */
int attn__cursor_expect(attn__cursor *c, int ch);
/* After whitespace, whether the text has ended. */
int attn__cursor_at_end(attn__cursor *c);

/* Reads a literal of the cursor's dialect (True/False/None or true/false/null) if
 * one is next, as a whole word, and returns what it means; else returns
 * ATTN__LITERAL_NONE and consumes nothing but whitespace. */
attn__literal attn__cursor_literal(attn__cursor *c);

/* Reads a non-negative decimal integer (see the rule above) that is at most max.
 * `what` names the number in messages ("the shape", "data_offsets"). */
int attn__cursor_uint(attn__cursor *c, uint64_t max, uint64_t *out, const char *what);

/* Reads a quoted string into buf (at most cap - 1 bytes and a NUL). A longer string is
 * an error "a string longer than CAP - 1 bytes". *len (when not NULL) receives its
 * length, which may be less than strlen(buf) would say when it holds a NUL. */
int attn__cursor_string(attn__cursor *c, char *buf, size_t cap, size_t *len);
/* Reads a quoted string into a new allocation from the ctx's allocator (free it with
 * attn__free); out == NULL checks and skips the string. */
int attn__cursor_string_alloc(attn__cursor *c, char **out, size_t *len);

/* Checks and skips one JSON value of any kind (nested at most 64 deep), numbers by
 * JSON's grammar. JSON dialect only. */
int attn__cursor_skip_json(attn__cursor *c);

/* ---- helpers for names and messages ------------------------------------------ */

/* Returns the byte offset of the first byte of s[0..n) that is not part of valid
 * UTF-8 (overlong forms, surrogates and code points above U+10FFFF are invalid, as
 * Python's and Rust's decoders say), or n when all of it is valid. */
size_t attn__utf8_invalid_at(const unsigned char *s, size_t n);

/* Copies s into buf for a one-line message: at most 80 bytes, then "..."; control
 * bytes and bytes of invalid UTF-8 are shown as '?'. Returns buf. cap >= 8. */
const char *attn__printable(const char *s, char *buf, size_t cap);

#endif /* ATTN_TEXT_CURSOR_H */
