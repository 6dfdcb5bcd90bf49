/*
 * text_cursor.c - the one text reader of the .npy and .safetensors headers (see
 * text_cursor.h for the rules it enforces and why).
 *
 * Sources for the two dialects: JSON is RFC 8259 (strings section 7, numbers
 * section 6); Python's string and integer literals are "Lexical analysis" in the
 * Python Language Reference (sections "String and Bytes literals" and "Integer
 * literals"). UTF-8 validity follows RFC 3629 section 4.
 */
#include "text_cursor.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#define CURSOR_MAX_DEPTH 64

void attn__cursor_init(attn__cursor *c, attn_ctx *ctx, const char *path,
                       const char *header, attn__syntax syntax, int utf8, const void *s,
                       size_t n)
{
    memset(c, 0, sizeof(*c));
    c->ctx = ctx;
    c->path = path ? path : "(null)";
    c->header = header;
    c->syntax = syntax;
    c->utf8 = utf8;
    c->s = s;
    c->n = n;
}

int attn__cursor_fail(attn__cursor *c, const char *fmt, ...)
{
    char what[192];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof(what), fmt, ap);
    va_end(ap);
    return attn__fail(c->ctx, ATTN_STATUS_FORMAT, "%s: %s: %s at byte %zu of the header",
                      c->path, c->header, what, c->i);
}

static int is_space(int ch)
{
    return ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r';
}

static int is_digit(int ch)
{
    return ch >= '0' && ch <= '9';
}

/* A byte that may continue a word or a number: seeing one right after a literal or a
 * number means the token is longer than what was read (e.g. "Truex", "12abc"). */
static int is_word(int ch)
{
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || is_digit(ch) ||
           ch == '_' || ch >= 0x80;
}

int attn__cursor_peek(attn__cursor *c)
{
    while (c->i < c->n && is_space(c->s[c->i]))
        c->i++;
    return c->i < c->n ? c->s[c->i] : -1;
}

int attn__cursor_accept(attn__cursor *c, int ch)
{
    if (attn__cursor_peek(c) != ch)
        return 0;
    c->i++;
    return 1;
}

int attn__cursor_expect(attn__cursor *c, int ch)
{
    if (attn__cursor_accept(c, ch))
        return ATTN_OK;
    return attn__cursor_fail(c, "expected '%c'", ch);
}

int attn__cursor_at_end(attn__cursor *c)
{
    return attn__cursor_peek(c) == -1;
}

attn__literal attn__cursor_literal(attn__cursor *c)
{
    static const char *const python[3] = {"False", "True", "None"};
    static const char *const json[3] = {"false", "true", "null"};
    const char *const *words = c->syntax == ATTN__SYNTAX_JSON ? json : python;
    attn__cursor_peek(c);
    for (int k = 0; k < 3; k++) {
        size_t len = strlen(words[k]);
        if (c->n - c->i >= len && memcmp(c->s + c->i, words[k], len) == 0 &&
            (c->i + len == c->n || !is_word(c->s[c->i + len]))) {
            c->i += len;
            return (attn__literal)k;
        }
    }
    return ATTN__LITERAL_NONE;
}

int attn__cursor_uint(attn__cursor *c, uint64_t max, uint64_t *out, const char *what)
{
    int ch = attn__cursor_peek(c);
    if (ch == '-' || ch == '+')
        return attn__cursor_fail(c, "%s must hold non-negative integers without a sign",
                                 what);
    if (!is_digit(ch))
        return attn__cursor_fail(c, "expected a non-negative integer in %s", what);
    size_t start = c->i;
    uint64_t v = 0;
    int too_big = 0;
    while (c->i < c->n && is_digit(c->s[c->i])) {
        unsigned d = (unsigned)(c->s[c->i] - '0');
        if (d > max || v > (max - d) / 10)
            too_big = 1;
        else
            v = v * 10 + d;
        c->i++;
    }
    if (c->s[start] == '0' && c->i - start > 1) {
        c->i = start;
        return attn__cursor_fail(c, "a number in %s has a leading zero", what);
    }
    if (c->long_suffix && c->i < c->n && c->s[c->i] == 'L')
        c->i++;
    if (c->i < c->n && (is_word(c->s[c->i]) || c->s[c->i] == '.'))
        return attn__cursor_fail(c, "%s must hold plain decimal integers", what);
    if (too_big) {
        c->i = start;
        return attn__fail(c->ctx, ATTN_STATUS_OVERFLOW,
                          "%s: %s: a number in %s is larger than %llu, the largest "
                          "allowed, at byte %zu of the header",
                          c->path, c->header, what, (unsigned long long)max, start);
    }
    *out = v;
    return ATTN_OK;
}

/* ---- UTF-8 ---------------------------------------------------------------------- */

/* The length of the valid UTF-8 sequence at s[0..n), or 0 when it is not one
 * (RFC 3629: no overlong forms, no surrogates, nothing above U+10FFFF). */
static size_t utf8_seq(const unsigned char *s, size_t n)
{
    unsigned b = s[0];
    if (b < 0x80)
        return 1;
    size_t len;
    unsigned lo = 0x80, hi = 0xbf; /* the allowed range of the second byte */
    if (b >= 0xc2 && b <= 0xdf) {
        len = 2;
    } else if (b >= 0xe0 && b <= 0xef) {
        len = 3;
        if (b == 0xe0)
            lo = 0xa0; /* shorter forms are overlong */
        if (b == 0xed)
            hi = 0x9f; /* U+D800..U+DFFF are surrogates */
    } else if (b >= 0xf0 && b <= 0xf4) {
        len = 4;
        if (b == 0xf0)
            lo = 0x90;
        if (b == 0xf4)
            hi = 0x8f; /* above U+10FFFF */
    } else {
        return 0;
    }
    if (n < len || s[1] < lo || s[1] > hi)
        return 0;
    for (size_t k = 2; k < len; k++)
        if (s[k] < 0x80 || s[k] > 0xbf)
            return 0;
    return len;
}

size_t attn__utf8_invalid_at(const unsigned char *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        size_t len = utf8_seq(s + i, n - i);
        if (!len)
            return i;
        i += len;
    }
    return n;
}

const char *attn__printable(const char *s, char *buf, size_t cap)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t n = strlen(s), i = 0, o = 0;
    while (i < n && i < 80 && o + 4 + 4 < cap) {
        size_t len = utf8_seq(u + i, n - i);
        if (len > 1) {
            memcpy(buf + o, u + i, len);
            o += len;
            i += len;
            continue;
        }
        buf[o++] = (len == 0 || u[i] < 0x20 || u[i] == 0x7f) ? '?' : (char)u[i];
        i++;
    }
    if (i < n) {
        memcpy(buf + o, "...", 3);
        o += 3;
    }
    buf[o] = '\0';
    return buf;
}

/* ---- strings -------------------------------------------------------------------- */

/* Appends code point cp as UTF-8 to dst (when not NULL) at *len. */
static void put_utf8(unsigned char *dst, size_t *len, unsigned cp)
{
    unsigned char b[4];
    size_t k;
    if (cp < 0x80) {
        b[0] = (unsigned char)cp;
        k = 1;
    } else if (cp < 0x800) {
        b[0] = (unsigned char)(0xc0 | (cp >> 6));
        b[1] = (unsigned char)(0x80 | (cp & 0x3f));
        k = 2;
    } else if (cp < 0x10000) {
        b[0] = (unsigned char)(0xe0 | (cp >> 12));
        b[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3f));
        b[2] = (unsigned char)(0x80 | (cp & 0x3f));
        k = 3;
    } else {
        b[0] = (unsigned char)(0xf0 | (cp >> 18));
        b[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3f));
        b[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3f));
        b[3] = (unsigned char)(0x80 | (cp & 0x3f));
        k = 4;
    }
    if (dst)
        memcpy(dst + *len, b, k);
    *len += k;
}

/* Reads `digits` hex digits at c->i, but not past `end`. */
static int hex_digits(attn__cursor *c, size_t end, int digits, unsigned *out)
{
    if (end - c->i < (size_t)digits)
        return attn__cursor_fail(c, "a truncated escape");
    unsigned v = 0;
    for (int k = 0; k < digits; k++) {
        int ch = c->s[c->i];
        unsigned d;
        if (is_digit(ch))
            d = (unsigned)(ch - '0');
        else if (ch >= 'a' && ch <= 'f')
            d = (unsigned)(ch - 'a' + 10);
        else if (ch >= 'A' && ch <= 'F')
            d = (unsigned)(ch - 'A' + 10);
        else
            return attn__cursor_fail(c, "a bad hex digit in an escape");
        v = v * 16 + d;
        c->i++;
    }
    *out = v;
    return ATTN_OK;
}

/* JSON's \uXXXX, with a surrogate pair taking two escapes (RFC 8259 section 7). */
static int json_u_escape(attn__cursor *c, size_t end, unsigned *cp)
{
    int st = hex_digits(c, end, 4, cp);
    if (st)
        return st;
    if (*cp >= 0xdc00 && *cp < 0xe000)
        return attn__cursor_fail(c, "an unpaired surrogate in a \\u escape");
    if (*cp < 0xd800 || *cp >= 0xdc00)
        return ATTN_OK;
    unsigned lo = 0;
    if (end - c->i < 6 || c->s[c->i] != '\\' || c->s[c->i + 1] != 'u')
        return attn__cursor_fail(c, "an unpaired surrogate in a \\u escape");
    c->i += 2;
    if ((st = hex_digits(c, end, 4, &lo)))
        return st;
    if (lo < 0xdc00 || lo >= 0xe000)
        return attn__cursor_fail(c, "an unpaired surrogate in a \\u escape");
    *cp = 0x10000 + ((*cp - 0xd800) << 10) + (lo - 0xdc00);
    return ATTN_OK;
}

/* One escape after the backslash at c->i - 1, by the dialect's rules. *cp receives
 * the code point, or -1 for an escape that produces nothing (Python's backslash-
 * newline). */
static int escape(attn__cursor *c, size_t end, long *cp)
{
    int ch = c->s[c->i++];
    unsigned v = 0;
    int st;
    switch (ch) {
    case '"': case '\\': *cp = ch; return ATTN_OK;
    case 'b': *cp = '\b'; return ATTN_OK;
    case 'f': *cp = '\f'; return ATTN_OK;
    case 'n': *cp = '\n'; return ATTN_OK;
    case 'r': *cp = '\r'; return ATTN_OK;
    case 't': *cp = '\t'; return ATTN_OK;
    }
    if (c->syntax == ATTN__SYNTAX_JSON) {
        if (ch == '/') {
            *cp = '/';
            return ATTN_OK;
        }
        if (ch != 'u') {
            c->i--;
            return attn__cursor_fail(c, "an unknown escape in a string");
        }
        if ((st = json_u_escape(c, end, &v)))
            return st;
        *cp = (long)v;
        return ATTN_OK;
    }
    /* Python's escapes. */
    switch (ch) {
    case '\'': *cp = '\''; return ATTN_OK;
    case 'a': *cp = '\a'; return ATTN_OK;
    case 'v': *cp = '\v'; return ATTN_OK;
    case '\n': *cp = -1; return ATTN_OK;
    case 'x': st = hex_digits(c, end, 2, &v); break;
    case 'u': st = hex_digits(c, end, 4, &v); break;
    case 'U': st = hex_digits(c, end, 8, &v); break;
    case 'N':
        c->i--;
        return attn__cursor_fail(c, "\\N{...} escapes are not supported");
    default:
        if (ch >= '0' && ch <= '7') {
            v = (unsigned)(ch - '0');
            for (int k = 0; k < 2 && c->i < end && c->s[c->i] >= '0' && c->s[c->i] <= '7'; k++)
                v = v * 8 + (unsigned)(c->s[c->i++] - '0');
            st = ATTN_OK;
            break;
        }
        /* Python keeps an unknown escape as written: the backslash here, the
         * character after it read as an ordinary one. */
        c->i--;
        *cp = '\\';
        return ATTN_OK;
    }
    if (st)
        return st;
    if (v > 0x10ffff || (v >= 0xd800 && v < 0xe000))
        return attn__cursor_fail(c, "an escape for U+%X, which UTF-8 cannot hold", v);
    *cp = (long)v;
    return ATTN_OK;
}

/* Decodes the string that starts at c->i (the opening quote) into dst (NULL: only
 * check and measure), *len bytes. On success c->i is past the closing quote. */
static int decode_string(attn__cursor *c, unsigned char *dst, size_t *len)
{
    size_t start = c->i;
    int q = c->s[c->i++];
    *len = 0;
    for (;;) {
        if (c->i >= c->n) {
            c->i = start;
            return attn__cursor_fail(c, "an unterminated string");
        }
        unsigned ch = c->s[c->i];
        if (ch == (unsigned)q) {
            c->i++;
            return ATTN_OK;
        }
        if (c->syntax == ATTN__SYNTAX_JSON ? ch < 0x20 : (ch == '\n' || ch == '\r'))
            return attn__cursor_fail(c, "a %s in a string",
                                     ch == '\n' || ch == '\r' ? "line break"
                                                              : "control character");
        if (ch == '\\') {
            c->i++;
            if (c->i >= c->n)
                continue; /* reported as unterminated above */
            long cp = -1;
            int st = escape(c, c->n, &cp);
            if (st)
                return st;
            if (cp >= 0)
                put_utf8(dst, len, (unsigned)cp);
            continue;
        }
        if (ch < 0x80) {
            if (dst)
                dst[*len] = (unsigned char)ch;
            (*len)++;
            c->i++;
        } else if (c->utf8) {
            size_t k = utf8_seq(c->s + c->i, c->n - c->i);
            if (!k)
                return attn__cursor_fail(c, "a string that is not valid UTF-8");
            if (dst)
                memcpy(dst + *len, c->s + c->i, k);
            *len += k;
            c->i += k;
        } else {
            put_utf8(dst, len, ch); /* latin-1: the byte is the code point */
            c->i++;
        }
    }
}

static int string_start(attn__cursor *c)
{
    int q = attn__cursor_peek(c);
    if (q == '"' || (q == '\'' && c->syntax == ATTN__SYNTAX_PYTHON))
        return ATTN_OK;
    return attn__cursor_fail(c, "expected a quoted string");
}

int attn__cursor_string(attn__cursor *c, char *buf, size_t cap, size_t *len)
{
    int st = string_start(c);
    if (st)
        return st;
    size_t start = c->i, n;
    if ((st = decode_string(c, NULL, &n)))
        return st;
    if (n + 1 > cap) {
        c->i = start;
        return attn__cursor_fail(c, "a string longer than %zu bytes", cap - 1);
    }
    c->i = start;
    decode_string(c, (unsigned char *)buf, &n); /* cannot fail the second time */
    buf[n] = '\0';
    if (len)
        *len = n;
    return ATTN_OK;
}

int attn__cursor_string_alloc(attn__cursor *c, char **out, size_t *len)
{
    int st = string_start(c);
    if (st)
        return st;
    size_t start = c->i, n;
    if ((st = decode_string(c, NULL, &n)))
        return st;
    if (len)
        *len = n;
    if (!out)
        return ATTN_OK;
    char *buf = attn__alloc(c->ctx, n + 1, "a string of a file header");
    if (!buf)
        return attn__alloc_status(c->ctx);
    c->i = start;
    decode_string(c, (unsigned char *)buf, &n);
    buf[n] = '\0';
    *out = buf;
    return ATTN_OK;
}

/* ---- skipping JSON values ------------------------------------------------------- */

/* A JSON number: -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)? (RFC 8259 section 6). */
static int skip_json_number(attn__cursor *c)
{
    size_t start = c->i;
    if (c->i < c->n && c->s[c->i] == '-')
        c->i++;
    size_t d0 = c->i;
    while (c->i < c->n && is_digit(c->s[c->i]))
        c->i++;
    if (c->i == d0)
        return attn__cursor_fail(c, "a malformed number");
    if (c->s[d0] == '0' && c->i - d0 > 1) {
        c->i = start;
        return attn__cursor_fail(c, "a number with a leading zero");
    }
    if (c->i < c->n && c->s[c->i] == '.') {
        size_t f0 = ++c->i;
        while (c->i < c->n && is_digit(c->s[c->i]))
            c->i++;
        if (c->i == f0)
            return attn__cursor_fail(c, "a malformed number");
    }
    if (c->i < c->n && (c->s[c->i] == 'e' || c->s[c->i] == 'E')) {
        c->i++;
        if (c->i < c->n && (c->s[c->i] == '+' || c->s[c->i] == '-'))
            c->i++;
        size_t e0 = c->i;
        while (c->i < c->n && is_digit(c->s[c->i]))
            c->i++;
        if (c->i == e0)
            return attn__cursor_fail(c, "a malformed number");
    }
    if (c->i < c->n && is_word(c->s[c->i]))
        return attn__cursor_fail(c, "a malformed number");
    return ATTN_OK;
}

static int skip_json(attn__cursor *c, int depth)
{
    if (depth > CURSOR_MAX_DEPTH)
        return attn__cursor_fail(c, "values nested more than %d deep", CURSOR_MAX_DEPTH);
    int ch = attn__cursor_peek(c), st;
    if (ch == '"')
        return attn__cursor_string_alloc(c, NULL, NULL);
    if (ch == '{' || ch == '[') {
        int close = ch == '{' ? '}' : ']';
        c->i++;
        if (attn__cursor_accept(c, close))
            return ATTN_OK;
        for (;;) {
            if (ch == '{' && ((st = attn__cursor_string_alloc(c, NULL, NULL)) ||
                              (st = attn__cursor_expect(c, ':'))))
                return st;
            if ((st = skip_json(c, depth + 1)))
                return st;
            if (attn__cursor_accept(c, close))
                return ATTN_OK;
            if (!attn__cursor_accept(c, ','))
                return attn__cursor_fail(c, "expected ',' or '%c'", close);
        }
    }
    if (ch == '-' || is_digit(ch))
        return skip_json_number(c);
    if (attn__cursor_literal(c) != ATTN__LITERAL_NONE)
        return ATTN_OK;
    return attn__cursor_fail(c, "expected a JSON value");
}

int attn__cursor_skip_json(attn__cursor *c)
{
    return skip_json(c, 1);
}
