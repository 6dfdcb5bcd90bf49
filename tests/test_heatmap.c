/*
 * test_heatmap.c - the heatmap SVG is well-formed XML with one titled cell per
 * entry, masked cells are marked, and the terminal drawing shades and labels.
 *
 * The drawing code lives with the tools (tools/common_heatmap.c), not in libattn,
 * so this test compiles it in. Well-formedness is checked by a small XML checker
 * below (balanced and properly nested tags, quoted attributes, known entities, one
 * root element) so the test needs nothing beyond a C compiler; tests/test_heatmap.sh
 * additionally runs xmllint on the real program's SVG when it is installed.
 */
#include "check.h"

#include "../tools/common_heatmap.c"

#include <ctype.h>
#include <stdlib.h>

#define TMP ATTN_TEST_TMP_DIR

/* What the checker found. */
typedef struct svg_stats {
    int well_formed;
    char error[256];
    int64_t cells;        /* <rect class="cell ..."> elements */
    int64_t masked_cells; /* of which class="cell masked" */
    int64_t titled_cells; /* cells whose first child is a non-empty <title> */
    char **titles;        /* the cells' title texts, in document order */
} svg_stats;

static int fail_at(svg_stats *st, const char *p, const char *why)
{
    snprintf(st->error, sizeof st->error, "%s near \"%.40s\"", why, p);
    st->well_formed = 0;
    return 0;
}

/* Checks an entity reference at *p (which is '&'); advances past it. */
static int entity_ok(const char **p)
{
    const char *s = *p;
    const char *names[] = {"&amp;", "&lt;", "&gt;", "&quot;", "&apos;"};
    for (int i = 0; i < 5; i++)
        if (!strncmp(s, names[i], strlen(names[i]))) {
            *p = s + strlen(names[i]);
            return 1;
        }
    if (s[1] == '#') {
        const char *q = s + 2;
        int hex = *q == 'x';
        if (hex)
            q++;
        const char *digits_start = q;
        while (hex ? isxdigit((unsigned char)*q) : isdigit((unsigned char)*q))
            q++;
        if (q > digits_start && *q == ';') {
            *p = q + 1;
            return 1;
        }
    }
    return 0;
}

static int is_name_char(char c)
{
    return isalnum((unsigned char)c) || c == '_' || c == '-' || c == ':' || c == '.' ||
           (unsigned char)c >= 0x80;
}

/* A minimal well-formedness check of the XML 1.0 subset the SVG uses, collecting
 * the cell statistics on the way. */
static int check_svg(const char *doc, svg_stats *st)
{
    memset(st, 0, sizeof *st);
    st->well_formed = 1;
    char stack[64][32];
    int depth = 0, roots = 0;
    int64_t cap = 0;
    int want_title = 0;  /* just opened a cell: its first child must be <title> */
    const char *p = doc;
    if (!strncmp(p, "<?xml", 5)) {
        const char *e = strstr(p, "?>");
        if (!e)
            return fail_at(st, p, "unterminated XML declaration");
        p = e + 2;
    }
    while (*p) {
        if (*p != '<') {
            if (depth == 0 && !isspace((unsigned char)*p))
                return fail_at(st, p, "text outside the root element");
            if (*p == '&') {
                if (!entity_ok(&p))
                    return fail_at(st, p, "bad entity");
                continue;
            }
            if (*p == '>')
                return fail_at(st, p, "stray '>'");
            p++;
            continue;
        }
        if (!strncmp(p, "<!--", 4)) {
            const char *e = strstr(p, "-->");
            if (!e)
                return fail_at(st, p, "unterminated comment");
            p = e + 3;
            continue;
        }
        if (p[1] == '/') { /* end tag */
            const char *n = p + 2, *q = n;
            while (is_name_char(*q))
                q++;
            if (depth == 0 || (size_t)(q - n) != strlen(stack[depth - 1]) ||
                strncmp(n, stack[depth - 1], (size_t)(q - n)))
                return fail_at(st, p, "end tag does not match the open element");
            while (isspace((unsigned char)*q))
                q++;
            if (*q != '>')
                return fail_at(st, p, "malformed end tag");
            depth--;
            p = q + 1;
            continue;
        }
        /* start tag */
        const char *n = p + 1, *q = n;
        while (is_name_char(*q))
            q++;
        size_t len = (size_t)(q - n);
        if (len == 0 || len >= sizeof stack[0])
            return fail_at(st, p, "bad element name");
        char name[32];
        memcpy(name, n, len);
        name[len] = '\0';
        if (depth == 0 && roots++ > 0)
            return fail_at(st, p, "a second root element");
        int is_cell = 0, is_masked = 0;
        char seen[16][32];
        int nseen = 0;
        for (;;) {
            while (isspace((unsigned char)*q))
                q++;
            if (*q == '>' || (q[0] == '/' && q[1] == '>'))
                break;
            const char *an = q;
            while (is_name_char(*q))
                q++;
            size_t alen = (size_t)(q - an);
            if (alen == 0 || alen >= 32)
                return fail_at(st, q, "bad attribute name");
            for (int i = 0; i < nseen; i++)
                if (strlen(seen[i]) == alen && !strncmp(seen[i], an, alen))
                    return fail_at(st, an, "repeated attribute");
            if (nseen < 16) {
                memcpy(seen[nseen], an, alen);
                seen[nseen++][alen] = '\0';
            }
            if (*q != '=' || (q[1] != '"' && q[1] != '\''))
                return fail_at(st, q, "attribute without a quoted value");
            char quote = q[1];
            const char *v = q + 2;
            q = v;
            while (*q && *q != quote) {
                if (*q == '<')
                    return fail_at(st, q, "'<' inside an attribute value");
                if (*q == '&') {
                    if (!entity_ok(&q))
                        return fail_at(st, q, "bad entity in an attribute");
                    continue;
                }
                q++;
            }
            if (!*q)
                return fail_at(st, v, "unterminated attribute value");
            if (alen == 5 && !strncmp(an, "class", 5) && !strcmp(name, "rect")) {
                is_cell = !strncmp(v, "cell", 4) && (v[4] == quote || v[4] == ' ');
                is_masked = is_cell && !strncmp(v, "cell masked", 11);
            }
            q++;
        }
        int self_closing = *q == '/';
        p = q + (self_closing ? 2 : 1);
        if (want_title) {
            want_title = 0;
            if (!strcmp(name, "title")) {
                const char *e = strstr(p, "</title>");
                if (e && e > p) {
                    st->titled_cells++;
                    if (st->titled_cells > cap) {
                        cap = cap ? 2 * cap : 256;
                        st->titles = realloc(st->titles, (size_t)cap * sizeof(char *));
                    }
                    size_t tl = (size_t)(e - p);
                    char *t = malloc(tl + 1);
                    memcpy(t, p, tl);
                    t[tl] = '\0';
                    st->titles[st->titled_cells - 1] = t;
                }
            }
        }
        if (is_cell) {
            st->cells++;
            st->masked_cells += is_masked;
            want_title = !self_closing;
        }
        if (!self_closing) {
            if (depth >= 64)
                return fail_at(st, p, "nesting too deep");
            strcpy(stack[depth++], name);
        }
    }
    if (depth != 0)
        return fail_at(st, p, "unclosed elements at the end");
    if (roots != 1)
        return fail_at(st, doc, "no root element");
    return 1;
}

static void free_stats(svg_stats *st)
{
    for (int64_t i = 0; i < st->titled_cells; i++)
        free(st->titles[i]);
    free(st->titles);
}

static char *read_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    size_t got = fread(buf, 1, (size_t)n, f);
    buf[got] = '\0';
    fclose(f);
    return buf;
}

static int count(const char *hay, const char *needle)
{
    int c = 0;
    for (const char *p = strstr(hay, needle); p; p = strstr(p + 1, needle))
        c++;
    return c;
}

/* A 4x3 weights panel (query ids 7, 8, 9, 0; key ids 7, 8, 9) whose last key is
 * masked for the first row, and a 1x3 mask panel, with a title that needs escaping. */
static const float weights[12] = {0.5f, 0.5f, 0.0f, 0.25f, 0.25f, 0.5f,
                                  1.0f, 0.0f, 0.0f, 0.125f, 0.375f, 0.5f};
static const uint8_t off[12] = {0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0};
static const float mask_row[3] = {1.0f, 1.0f, 0.0f};
static const uint8_t mask_off[3] = {0, 0, 1};
static const int64_t qids[4] = {7, 8, 9, 0}, kids[3] = {7, 8, 9};

static void make_panels(heatmap_panel p[2])
{
    memset(p, 0, 2 * sizeof p[0]);
    p[0].title = "padding <mask> & \"friends\"";
    p[0].rows = 1;
    p[0].cols = 3;
    p[0].values = mask_row;
    p[0].col_stride = 1;
    p[0].masked = mask_off;
    p[0].mask_col_stride = 1;
    p[0].col_labels = kids;
    p[0].col_axis = "key";
    p[0].is_mask = 1;
    p[1].title = "head 0 weights";
    p[1].rows = 4;
    p[1].cols = 3;
    p[1].values = weights;
    p[1].row_stride = 3;
    p[1].col_stride = 1;
    p[1].masked = off;
    p[1].mask_row_stride = 3;
    p[1].mask_col_stride = 1;
    p[1].row_labels = qids;
    p[1].col_labels = kids;
    p[1].row_axis = "query";
    p[1].col_axis = "key";
}

static void test_svg(void)
{
    heatmap_panel p[2];
    make_panels(p);
    const char *path = TMP "/test_heatmap.svg";

    TEST("the SVG is well-formed XML even when titles hold <, & and quotes");
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    if (!f)
        return;
    CHECK_INT(heatmap_write_svg(f, "a <title> & more", p, 2, 1, 4), 0);
    fclose(f);
    char *doc = read_file(path);
    CHECK(doc != NULL);
    if (!doc)
        return;
    svg_stats st;
    check_svg(doc, &st);
    if (!st.well_formed)
        fprintf(stderr, "  not well-formed: %s\n", st.error);
    CHECK(st.well_formed);
    CHECK_STR_CONTAINS(doc, "<svg xmlns=\"http://www.w3.org/2000/svg\"");

    TEST("there is one <rect class=\"cell\"> per entry, each with a <title>");
    CHECK_INT(st.cells, 1 * 3 + 4 * 3);
    CHECK_INT(heatmap_cell_count(p, 2), 15);
    CHECK_INT(st.titled_cells, st.cells);

    TEST("masked cells are marked: hatched, and their title says so");
    CHECK_INT(st.masked_cells, 2); /* one in the mask panel, one in the weights panel */
    CHECK_INT(count(doc, "fill=\"url(#masked)\">"), 2);
    CHECK_STR_CONTAINS(doc, "<pattern id=\"masked\"");

    TEST("a cell's title names the panel, the query and key positions with token ids, "
         "and holds the value");
    if (st.titled_cells == 15) {
        /* Document order: the mask panel's 3 cells, then the weights row by row. */
        CHECK_STR_EQ(st.titles[0], "padding &lt;mask&gt; &amp; &quot;friends&quot;: row 0 "
                                   "\xe2\x86\x92 key 0 (token 7) = 1 (may attend)");
        CHECK_STR_CONTAINS(st.titles[2], "= 0 (masked)");
        CHECK_STR_EQ(st.titles[3 + 1], "head 0 weights: query 0 (token 7) \xe2\x86\x92 "
                                       "key 1 (token 8) = 0.500000");
        CHECK_STR_CONTAINS(st.titles[3 + 2], "= 0.000000 (masked)");
        CHECK_STR_CONTAINS(st.titles[3 + 9], "query 3 (token 0) \xe2\x86\x92 key 0 (token 7) = 0.125000");
    }

    TEST("the picture has a colour scale from 0 to 1 and labels its axes with token ids");
    CHECK_STR_CONTAINS(doc, "<linearGradient id=\"scale\"");
    CHECK_STR_CONTAINS(doc, ">0.00</text>");
    CHECK_STR_CONTAINS(doc, ">1.00</text>");
    CHECK_STR_CONTAINS(doc, "text-anchor=\"end\">9</text>"); /* a query id */
    CHECK_STR_CONTAINS(doc, "key token id");
    free_stats(&st);
    free(doc);

    TEST("the checker itself rejects broken XML (so the checks above can fail)");
    const char *bad[] = {
        "<svg><rect></svg>",
        "<svg a=\"1\" a=\"2\"/>",
        "<svg><title>x & y</title></svg>",
        "<svg x=1/>",
        "<svg/><svg/>",
        "<svg><g></svg></g>",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        svg_stats b;
        check_svg(bad[i], &b);
        CHECK(!b.well_formed);
        free_stats(&b);
    }
}

static void test_cells_scale_with_size(void)
{
    TEST("a large panel (100 x 100) still has one cell per entry and stays well-formed");
    int64_t T = 100;
    float *v = malloc((size_t)(T * T) * sizeof(float));
    int64_t *ids = malloc((size_t)T * sizeof(int64_t));
    for (int64_t i = 0; i < T * T; i++)
        v[i] = (float)(i % 7) / 6.0f;
    for (int64_t i = 0; i < T; i++)
        ids[i] = i + 1;
    heatmap_panel p;
    memset(&p, 0, sizeof p);
    p.title = "big";
    p.rows = p.cols = T;
    p.values = v;
    p.row_stride = T;
    p.col_stride = 1;
    p.row_labels = p.col_labels = ids;
    p.row_axis = "query";
    p.col_axis = "key";
    const char *path = TMP "/test_heatmap_big.svg";
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    if (f) {
        CHECK_INT(heatmap_write_svg(f, "big", &p, 1, 1, 1), 0);
        fclose(f);
        char *doc = read_file(path);
        svg_stats st;
        check_svg(doc, &st);
        CHECK(st.well_formed);
        CHECK_INT(st.cells, T * T);
        CHECK_INT(st.titled_cells, T * T);
        free_stats(&st);
        free(doc);
    }
    free(v);
    free(ids);
}

static void test_terminal(void)
{
    heatmap_panel p[2];
    make_panels(p);
    const char *path = TMP "/test_heatmap_term.txt";

    TEST("--show's drawing shades by value, marks masked cells and labels token ids, "
         "without escape codes when colour is off");
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    if (!f)
        return;
    CHECK_INT(heatmap_print_terminal(f, p, 2, 0), 0);
    fclose(f);
    char *txt = read_file(path);
    CHECK_STR_CONTAINS(txt, "head 0 weights  (rows: query token id, columns: key token id)");
    CHECK_STR_CONTAINS(txt, "\xe2\x96\x88\xe2\x96\x88\xe2\x96\x88"); /* 1.0: full blocks */
    CHECK_STR_CONTAINS(txt, "\xe2\x96\x93\xe2\x96\x93\xe2\x96\x93"); /* 0.5: dark shade */
    CHECK_STR_CONTAINS(txt, "\xc3\x97\xc3\x97\xc3\x97");             /* masked */
    CHECK_STR_CONTAINS(txt, "    9 "); /* a query id label */
    CHECK(strchr(txt, '\x1b') == NULL);
    /* 2 masked cells, 3 characters each */
    CHECK_INT(count(txt, "\xc3\x97\xc3\x97\xc3\x97"), 2);
    free(txt);

    TEST("with colour on, every cell gets a 24-bit background colour and a reset");
    f = fopen(path, "w");
    CHECK(f != NULL);
    if (!f)
        return;
    CHECK_INT(heatmap_print_terminal(f, p, 2, 1), 0);
    fclose(f);
    txt = read_file(path);
    CHECK_INT(count(txt, "\x1b[48;2;"), 15);
    CHECK_INT(count(txt, "\x1b[0m"), 15);

    TEST("with colour on, a cell shows its value on its colour (not a block that would "
         "hide the colour)");
    CHECK_STR_CONTAINS(txt, "0.50");
    CHECK_STR_CONTAINS(txt, "0.25");
    CHECK(strstr(txt, "\xe2\x96\x88") == NULL);
    /* value 1.0 gets viridis yellow and dark text */
    CHECK_STR_CONTAINS(txt, "\x1b[48;2;253;231;37m\x1b[38;2;20;20;20m1.00\x1b[0m");
    free(txt);
}

static void test_colors(void)
{
    TEST("the colour scale runs from viridis' dark purple at 0 to its yellow at 1 and "
         "clamps outside");
    int rgb[3];
    heatmap_color(0.0, rgb);
    CHECK(rgb[0] == 0x44 && rgb[1] == 0x01 && rgb[2] == 0x54);
    heatmap_color(1.0, rgb);
    CHECK(rgb[0] == 0xfd && rgb[1] == 0xe7 && rgb[2] == 0x25);
    heatmap_color(-3.0, rgb);
    CHECK(rgb[0] == 0x44);
    heatmap_color(NAN, rgb);
    CHECK(rgb[0] == 0x44);
    heatmap_color(7.0, rgb);
    CHECK(rgb[0] == 0xfd);
    int prev = -1, monotone = 1;
    for (int i = 0; i <= 100; i++) {
        heatmap_color(i / 100.0, rgb);
        int luma = 2126 * rgb[0] + 7152 * rgb[1] + 722 * rgb[2];
        monotone &= luma >= prev;
        prev = luma;
    }
    CHECK(monotone); /* brighter means more weight, also in grey */
}

int main(void)
{
    test_svg();
    test_cells_scale_with_size();
    test_terminal();
    test_colors();
    return check_summary("test_heatmap");
}
