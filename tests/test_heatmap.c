/*
 * test_heatmap.c - the heatmap SVG is well-formed XML with one titled cell per
 * entry, masked cells are marked (a masked score says -inf), every kind of panel
 * (masks, scaled scores, weights) has its own colours and key, positions and token
 * ids are labelled "pos P (id I)", and the terminal drawing shades and labels.
 *
 * The drawing code lives with the tools (tools/common_heatmap.c), not in libattn,
 * so this test compiles it in. Well-formedness is checked by a small XML checker
 * below (balanced and properly nested tags, quoted attributes, known entities, one
 * root element) so the test needs nothing beyond a C compiler; tests/test_heatmap_svg.sh
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

/* Three panels with a title that needs escaping: a 1x3 mask panel (key ids 7, 8, 9;
 * the last key masked), then 4x3 scaled scores and 4x3 weights (query ids 7, 8, 9, 0)
 * whose last key is masked for the first row. The scores' -inf is that masked cell. */
static const float weights[12] = {0.5f, 0.5f, 0.0f, 0.25f, 0.25f, 0.5f,
                                  1.0f, 0.0f, 0.0f, 0.125f, 0.375f, 0.5f};
static const float scores[12] = {0.5f, -1.25f, -INFINITY, 2.0f, 0.0f, -0.5f,
                                 1.0f, -2.0f, 0.25f, 0.75f, -0.75f, 1.5f};
static const uint8_t off[12] = {0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0};
static const float mask_row[3] = {1.0f, 1.0f, 0.0f};
static const uint8_t mask_off[3] = {0, 0, 1};
static const int64_t qids[4] = {7, 8, 9, 0}, kids[3] = {7, 8, 9};

#define NPANELS 3
#define NCELLS (1 * 3 + 4 * 3 + 4 * 3)

static void make_panels(heatmap_panel p[NPANELS])
{
    memset(p, 0, NPANELS * sizeof p[0]);
    p[0].title = "padding <mask> & \"friends\"";
    p[0].rows = 1;
    p[0].cols = 3;
    p[0].values = mask_row;
    p[0].col_stride = 1;
    p[0].masked = mask_off;
    p[0].mask_col_stride = 1;
    p[0].col_labels = kids;
    p[0].col_axis = "key";
    p[0].kind = HEATMAP_MASK;
    for (int k = 1; k < 3; k++) {
        p[k].title = k == 1 ? "head 0 scaled scores" : "head 0 weights";
        p[k].rows = 4;
        p[k].cols = 3;
        p[k].values = k == 1 ? scores : weights;
        p[k].row_stride = 3;
        p[k].col_stride = 1;
        p[k].masked = off;
        p[k].mask_row_stride = 3;
        p[k].mask_col_stride = 1;
        p[k].row_labels = qids;
        p[k].col_labels = kids;
        p[k].row_axis = "query";
        p[k].col_axis = "key";
        p[k].kind = k == 1 ? HEATMAP_SCORES : HEATMAP_WEIGHTS;
        p[k].new_row = 1;
    }
}

/* The text of the <g> element that starts with `open`, up to its "</g>", or NULL. */
static char *group_text(const char *doc, const char *open)
{
    const char *a = strstr(doc, open);
    const char *b = a ? strstr(a, "</g>") : NULL;
    if (!b)
        return NULL;
    char *g = malloc((size_t)(b - a) + 1);
    if (g) {
        memcpy(g, a, (size_t)(b - a));
        g[b - a] = '\0';
    }
    return g;
}

static void test_svg(void)
{
    heatmap_panel p[NPANELS];
    make_panels(p);
    const char *path = TMP "/test_heatmap.svg";

    TEST("the SVG is well-formed XML even when titles hold <, & and quotes");
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    if (!f)
        return;
    CHECK_INT(heatmap_write_svg(f, "a <title> & more", p, NPANELS, 1, 4), 0);
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
    CHECK_INT(st.cells, NCELLS);
    CHECK_INT(heatmap_cell_count(p, NPANELS), NCELLS);
    CHECK_INT(st.titled_cells, st.cells);

    TEST("masked cells are marked: hatched, and their title says so");
    CHECK_INT(st.masked_cells, 3); /* one in each panel */
    CHECK_INT(count(doc, "fill=\"url(#masked)\">"), 3);
    CHECK_STR_CONTAINS(doc, "<pattern id=\"masked\"");

    TEST("a cell's title names the panel, the query and key as \"pos P (id I)\", and "
         "holds the value");
    if (st.titled_cells == NCELLS) {
        /* Document order: the mask panel's 3 cells, the scores, then the weights,
         * row by row. */
        CHECK_STR_EQ(st.titles[0], "padding &lt;mask&gt; &amp; &quot;friends&quot;: any query "
                                   "\xe2\x86\x92 key pos 0 (id 7) = 1 (may attend)");
        CHECK_STR_CONTAINS(st.titles[2], "key pos 2 (id 9) = 0 (masked)");
        CHECK_STR_EQ(st.titles[3 + 3], "head 0 scaled scores: query pos 1 (id 8) \xe2\x86\x92 "
                                       "key pos 0 (id 7) = 2.000000");
        CHECK_STR_EQ(st.titles[15 + 1], "head 0 weights: query pos 0 (id 7) \xe2\x86\x92 "
                                        "key pos 1 (id 8) = 0.500000");
        CHECK_STR_CONTAINS(st.titles[15 + 2], "= 0.000000 (masked)");
        CHECK_STR_EQ(st.titles[15 + 9], "head 0 weights: query pos 3 (id 0) \xe2\x86\x92 "
                                        "key pos 0 (id 7) = 0.125000");
    }

    TEST("a masked score is -inf, said so in its title and written in its cell");
    if (st.titled_cells == NCELLS)
        CHECK_STR_EQ(st.titles[3 + 2], "head 0 scaled scores: query pos 0 (id 7) \xe2\x86\x92 "
                                       "key pos 2 (id 9) = -inf (masked)");
    CHECK_INT(count(doc, "= -inf (masked)</title>"), 1);
    CHECK_INT(count(doc, "fill=\"#222\">\xe2\x88\x92\xe2\x88\x9e</text>"), 1); /* in the cell */

    TEST("scores take the blue-white-red scale over [-max|score|, max|score|], not the "
         "weights' one");
    CHECK_STR_CONTAINS(doc, "fill=\"#b40426\"><title>head 0 scaled scores: query pos 1 (id 8) ");
    CHECK_STR_CONTAINS(doc, "fill=\"#3b4cc0\"><title>head 0 scaled scores: query pos 2 (id 9) "
                            "\xe2\x86\x92 key pos 1");
    CHECK_STR_CONTAINS(doc, "fill=\"#dddddd\"><title>head 0 scaled scores: query pos 1 (id 8) "
                            "\xe2\x86\x92 key pos 1");

    TEST("a mask's \"may attend\" cells have the masks' own colour and say 1");
    CHECK_INT(count(doc, "fill=\"#2e8b57\"><title>padding"), 2);

    TEST("each kind of panel has its own key: weights 0..1, scores -2..2 and -inf, masks "
         "1 and 0");
    char *gw = group_text(doc, "<g class=\"legend legend-weights\">");
    char *gs = group_text(doc, "<g class=\"legend legend-scores\">");
    char *gm = group_text(doc, "<g class=\"legend legend-masks\">");
    CHECK(gw != NULL && gs != NULL && gm != NULL);
    if (gw && gs && gm) {
        CHECK_STR_CONTAINS(gw, "fill=\"url(#scale)\"");
        CHECK_STR_CONTAINS(gw, ">0.00</text>");
        CHECK_STR_CONTAINS(gw, ">1.00</text>");
        CHECK_STR_CONTAINS(gw, "masked: weight exactly 0");
        CHECK_STR_CONTAINS(gs, "fill=\"url(#scores)\"");
        CHECK_STR_CONTAINS(gs, ">-2.00</text>");
        CHECK_STR_CONTAINS(gs, ">2.00</text>");
        CHECK_STR_CONTAINS(gs, "\xe2\x88\x92\xe2\x88\x9e masked score");
        CHECK_STR_CONTAINS(gm, "fill=\"#2e8b57\"");
        CHECK_STR_CONTAINS(gm, "1 = may attend");
        CHECK_STR_CONTAINS(gm, "0 = masked");
        CHECK(strstr(gm, "url(#scale)") == NULL); /* not the weights' shading */
    }
    free(gw);
    free(gs);
    free(gm);
    CHECK_STR_CONTAINS(doc, "<linearGradient id=\"scale\"");
    CHECK_STR_CONTAINS(doc, "<linearGradient id=\"scores\"");

    TEST("the axes are labelled \"pos P (id I)\" on both sides, and named");
    CHECK_STR_CONTAINS(doc, "text-anchor=\"end\">pos 3 (id 0)</text>"); /* a query */
    CHECK_STR_CONTAINS(doc, ">pos 2 (id 9)</text>");                    /* a key */
    CHECK_STR_CONTAINS(doc, "text-anchor=\"end\">any query</text>");
    CHECK_STR_CONTAINS(doc, "key pos (id) \xe2\x86\x92");
    CHECK_STR_CONTAINS(doc, "query pos (id)");
    free_stats(&st);
    free(doc);

    TEST("a picture of weights alone has only the weights' key");
    f = fopen(path, "w");
    CHECK(f != NULL);
    if (f) {
        CHECK_INT(heatmap_write_svg(f, "weights", &p[2], 1, 1, 4), 0);
        fclose(f);
        doc = read_file(path);
        CHECK(doc && strstr(doc, "legend-weights") != NULL);
        CHECK(doc && strstr(doc, "legend-scores") == NULL);
        CHECK(doc && strstr(doc, "legend-masks") == NULL);
        free(doc);
    }

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
    heatmap_panel p[NPANELS];
    make_panels(p);
    const char *path = TMP "/test_heatmap_term.txt";

    TEST("--show's drawing shades weights by value, marks masked cells, prints scores "
         "with -inf, labels rows \"pos P (id I)\", without escape codes when colour is off");
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    if (!f)
        return;
    CHECK_INT(heatmap_print_terminal(f, p, NPANELS, 0), 0);
    fclose(f);
    char *txt = read_file(path);
    CHECK_STR_CONTAINS(txt, "head 0 weights  (rows: query pos (id), columns: key pos (id))");
    CHECK_STR_CONTAINS(txt, "\xe2\x96\x88\xe2\x96\x88\xe2\x96\x88"); /* 1.0: full blocks */
    CHECK_STR_CONTAINS(txt, "\xe2\x96\x93\xe2\x96\x93\xe2\x96\x93"); /* 0.5: dark shade */
    CHECK_STR_CONTAINS(txt, "\xc3\x97\xc3\x97\xc3\x97");             /* a masked weight */
    CHECK_STR_CONTAINS(txt, "\npos 3 (id 0) "); /* a query's row label */
    CHECK_STR_CONTAINS(txt, "\nany query   1   1   \xc3\x97\n"); /* the mask's row */
    CHECK_STR_CONTAINS(txt, "\n         pos     0     1     2\n        (id)     7     8     9\n");
    CHECK_STR_CONTAINS(txt, "\npos 0 (id 7)  0.50 -1.25  -inf\n"); /* the scores' first row */
    CHECK_INT(count(txt, "-inf"), 2); /* the masked score and the scores' key */
    CHECK(strchr(txt, '\x1b') == NULL);
    /* 1 masked weight, 3 characters */
    CHECK_INT(count(txt, "\xc3\x97\xc3\x97\xc3\x97"), 1);

    TEST("--show ends with one key per kind of panel, the masks' distinct from the weights'");
    CHECK_STR_CONTAINS(txt, "key, masks:   1 = may attend   \xc3\x97 = masked (may not attend)\n");
    CHECK_STR_CONTAINS(txt, "key, scores:  ");
    CHECK_STR_CONTAINS(txt, "-inf = masked");
    CHECK_STR_CONTAINS(txt, "key, weights: \xc2\xb7 0   \xe2\x96\x91 <0.25");
    free(txt);

    TEST("with colour on, every cell gets a 24-bit background colour and a reset");
    f = fopen(path, "w");
    CHECK(f != NULL);
    if (!f)
        return;
    CHECK_INT(heatmap_print_terminal(f, p, NPANELS, 1), 0);
    fclose(f);
    txt = read_file(path);
    CHECK_INT(count(txt, "\x1b[48;2;"), NCELLS);
    CHECK_INT(count(txt, "\x1b[0m"), NCELLS);

    TEST("with colour on, a cell shows its value on its colour (not a block that would "
         "hide the colour), each kind on its own scale");
    CHECK_STR_CONTAINS(txt, "0.50");
    CHECK_STR_CONTAINS(txt, "0.25");
    CHECK(strstr(txt, "\xe2\x96\x88") == NULL);
    /* weight 1.0 gets viridis yellow and dark text */
    CHECK_STR_CONTAINS(txt, "\x1b[48;2;253;231;37m\x1b[38;2;20;20;20m1.00\x1b[0m");
    /* score 2.0 gets the red end, -inf the masked grey (as a masked weight), a mask's 1
     * its green; score cells are 5 wide here, for "-1.25" */
    CHECK_STR_CONTAINS(txt, "\x1b[48;2;180;4;38m\x1b[38;2;240;240;240m2.00 \x1b[0m");
    CHECK_STR_CONTAINS(txt, "\x1b[48;2;90;90;90m\x1b[38;2;200;200;200m-inf \x1b[0m");
    CHECK_STR_CONTAINS(txt, "\x1b[48;2;90;90;90m\x1b[38;2;200;200;200m \xc3\x97  \x1b[0m");
    CHECK_STR_CONTAINS(txt, "\x1b[48;2;46;139;87m\x1b[38;2;240;240;240m 1 \x1b[0m");
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

    TEST("the scores' scale is blue at -range, grey-white at 0, red at +range, clamps "
         "outside, and greys out -inf and NaN");
    heatmap_score_color(-2.0, 2.0, rgb);
    CHECK(rgb[0] == 0x3b && rgb[1] == 0x4c && rgb[2] == 0xc0);
    heatmap_score_color(0.0, 2.0, rgb);
    CHECK(rgb[0] == 0xdd && rgb[1] == 0xdd && rgb[2] == 0xdd);
    heatmap_score_color(2.0, 2.0, rgb);
    CHECK(rgb[0] == 0xb4 && rgb[1] == 0x04 && rgb[2] == 0x26);
    heatmap_score_color(50.0, 2.0, rgb);
    CHECK(rgb[0] == 0xb4);
    heatmap_score_color(-INFINITY, 2.0, rgb);
    CHECK(rgb[0] == 90 && rgb[1] == 90 && rgb[2] == 90);
    heatmap_score_color(NAN, 2.0, rgb);
    CHECK(rgb[0] == 90);
}

int main(void)
{
    test_svg();
    test_cells_scale_with_size();
    test_terminal();
    test_colors();
    return check_summary("test_heatmap");
}
