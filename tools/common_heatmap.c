/*
 * common_heatmap.c - SVG and terminal heatmaps of masks, scaled scores and attention
 * weights. See common_heatmap.h for what is drawn; this file is only layout, colour
 * and escaping.
 *
 * The SVG is plain SVG 1.1 that any browser shows: one <rect class="cell"> per
 * entry with a <title> child (browsers show it as a tooltip), text labels with the
 * positions and token ids, a hatch pattern for masked cells and one key per kind of
 * panel.
 */
#include "common_heatmap.h"

#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <string.h>

/* The weights' colour scale: eleven evenly spaced samples of matplotlib's "viridis"
 * (van der Walt and Smith, 2015; perceptually uniform and readable in grey and by
 * most colour-blind readers), linearly interpolated between them. */
static const int scale_rgb[11][3] = {
    {0x44, 0x01, 0x54}, {0x48, 0x24, 0x75}, {0x41, 0x44, 0x87}, {0x35, 0x5f, 0x8d},
    {0x2a, 0x78, 0x8e}, {0x21, 0x91, 0x8c}, {0x22, 0xa8, 0x84}, {0x44, 0xbf, 0x70},
    {0x7a, 0xd1, 0x51}, {0xbd, 0xdf, 0x26}, {0xfd, 0xe7, 0x25},
};

/* The scores' scale is diverging, because a score's sign matters (it is a dot
 * product) and 0 is its natural middle: the end and middle colours of Moreland's
 * "cool to warm" map (Moreland, "Diverging Color Maps for Scientific Visualization",
 * 2009), linearly interpolated. Its hues are far from viridis', so a score panel is
 * never read as weights. */
static const int score_rgb[3][3] = {{0x3b, 0x4c, 0xc0}, {0xdd, 0xdd, 0xdd}, {0xb4, 0x04, 0x26}};

/* A mask's "may attend" is one solid colour of its own (a green that neither scale
 * uses at full saturation), its "masked" the hatch every panel uses. */
static const int mask_rgb[3] = {0x2e, 0x8b, 0x57};

/* In the terminal, masked cells sit on this grey. */
static const int masked_rgb[3] = {90, 90, 90};

void heatmap_color(double value, int rgb[3])
{
    if (!(value >= 0.0)) /* also catches NaN */
        value = 0.0;
    if (value > 1.0)
        value = 1.0;
    double pos = value * 10.0;
    int i = (int)pos;
    if (i >= 10)
        i = 9;
    double f = pos - i;
    for (int c = 0; c < 3; c++)
        rgb[c] = (int)lround(scale_rgb[i][c] + f * (scale_rgb[i + 1][c] - scale_rgb[i][c]));
}

void heatmap_score_color(double value, double range, int rgb[3])
{
    if (!(value > -INFINITY) || value != value) {
        memcpy(rgb, masked_rgb, sizeof masked_rgb);
        return;
    }
    double t = range > 0.0 ? value / range : 0.0; /* -1 .. 1 */
    if (t < -1.0)
        t = -1.0;
    if (t > 1.0)
        t = 1.0;
    const int *a = score_rgb[1], *b = t < 0.0 ? score_rgb[0] : score_rgb[2];
    double f = fabs(t);
    for (int c = 0; c < 3; c++)
        rgb[c] = (int)lround(a[c] + f * (b[c] - a[c]));
}

/* Light colours get dark text and the other way round (Rec. 709 luma). */
static int is_light(const int rgb[3])
{
    return 0.2126 * rgb[0] + 0.7152 * rgb[1] + 0.0722 * rgb[2] > 140.0;
}

static double cell_value(const heatmap_panel *p, int64_t i, int64_t j)
{
    return (double)p->values[i * p->row_stride + j * p->col_stride];
}

/* A cell is masked where the panel's mask says so; a score of -inf is masked too,
 * because that is what masking does to a score. */
static int cell_masked(const heatmap_panel *p, int64_t i, int64_t j)
{
    if (p->kind == HEATMAP_SCORES && cell_value(p, i, j) == -INFINITY)
        return 1;
    if (!p->masked)
        return 0;
    return p->masked[i * p->mask_row_stride + j * p->mask_col_stride] != 0;
}

/* The largest finite |score| of a panel, for a panel that gives no range. */
static double panel_range(const heatmap_panel *p)
{
    if (p->range > 0.0)
        return p->range;
    double r = 0.0;
    for (int64_t i = 0; i < p->rows; i++)
        for (int64_t j = 0; j < p->cols; j++) {
            double v = cell_value(p, i, j);
            if (isfinite(v) && fabs(v) > r)
                r = fabs(v);
        }
    return r > 0.0 ? r : 1.0;
}

/* The cell's colour by the panel's kind. */
static void cell_color(const heatmap_panel *p, double range, double v, int masked, int rgb[3])
{
    if (masked)
        memcpy(rgb, masked_rgb, sizeof masked_rgb);
    else if (p->kind == HEATMAP_MASK)
        memcpy(rgb, mask_rgb, sizeof mask_rgb);
    else if (p->kind == HEATMAP_SCORES)
        heatmap_score_color(v, range, rgb);
    else
        heatmap_color(v, rgb);
}

/* The value as the cell shows it: "0.54", "1"/"0" for masks, "-inf" for a masked
 * score (ASCII, so that the terminal's columns line up). */
static void cell_text(char *buf, size_t size, const heatmap_panel *p, double v, int masked)
{
    if (p->kind == HEATMAP_MASK)
        snprintf(buf, size, "%d", v != 0.0 ? 1 : 0);
    else if (p->kind == HEATMAP_SCORES && masked)
        snprintf(buf, size, "-inf");
    else
        snprintf(buf, size, "%.2f", v);
}

int64_t heatmap_cell_count(const heatmap_panel *panels, int n)
{
    int64_t total = 0;
    for (int k = 0; k < n; k++)
        total += panels[k].rows * panels[k].cols;
    return total;
}

/* "pos 3 (id 4)", or "pos 3" without labels: the axes' tick labels. */
static void pos_label(char *buf, size_t size, int64_t pos, const int64_t *labels)
{
    if (labels)
        snprintf(buf, size, "pos %" PRId64 " (id %" PRId64 ")", pos, labels[pos]);
    else
        snprintf(buf, size, "pos %" PRId64, pos);
}

void heatmap_describe(char *buf, size_t size, const char *axis, int64_t pos,
                      const int64_t *labels)
{
    char l[64];
    pos_label(l, sizeof l, pos, labels);
    if (axis)
        snprintf(buf, size, "%s %s", axis, l);
    else
        snprintf(buf, size, "any query");
}

/* Writes text with the five XML special characters escaped. */
static void xml_text(FILE *f, const char *s)
{
    if (!f) /* measuring (see lprintf) */
        return;
    for (; *s; s++) {
        switch (*s) {
        case '&': fputs("&amp;", f); break;
        case '<': fputs("&lt;", f); break;
        case '>': fputs("&gt;", f); break;
        case '"': fputs("&quot;", f); break;
        case '\'': fputs("&apos;", f); break;
        default: fputc(*s, f);
        }
    }
}

/* The geometry shared by every panel of one picture. */
typedef struct layout {
    double cell;      /* cell side in px */
    double label_w;   /* room left of a panel for the row labels and the axis name */
    double title_h;   /* panel title */
    double collab_h;  /* column labels above the grid (turned, "pos 3 (id 4)") */
    double foot_h;    /* axis name below the grid */
    double gap;       /* between panels */
    int64_t label_every; /* label every k-th row/column when cells are small */
    int in_cell_text; /* print values inside cells */
} layout;

static double panel_w(const layout *L, const heatmap_panel *p)
{
    return L->label_w + (double)p->cols * L->cell + L->gap;
}

static double panel_h(const layout *L, const heatmap_panel *p)
{
    return L->title_h + L->collab_h + (double)p->rows * L->cell + L->foot_h + L->gap;
}

static void svg_panel(FILE *f, const layout *L, const heatmap_panel *p, double x0, double y0)
{
    const double gx = x0 + L->label_w, gy = y0 + L->title_h + L->collab_h;
    const double gw = (double)p->cols * L->cell, gh = (double)p->rows * L->cell;
    const double range = p->kind == HEATMAP_SCORES ? panel_range(p) : 1.0;
    char label[96];
    fprintf(f, "<g class=\"panel\">\n<text class=\"panel-title\" x=\"%.1f\" y=\"%.1f\">", gx,
            y0 + L->title_h - 8);
    xml_text(f, p->title);
    fputs("</text>\n", f);

    /* Column labels, "pos 3 (id 4)", turned so that they fit above narrow cells. */
    for (int64_t j = 0; j < p->cols; j++) {
        if (j % L->label_every)
            continue;
        double cx = gx + (j + 0.5) * L->cell + 3, cy = gy - 5;
        pos_label(label, sizeof label, j, p->col_labels);
        fprintf(f, "<text class=\"label\" x=\"%.1f\" y=\"%.1f\" transform=\"rotate(-55 %.1f %.1f)\">",
                cx, cy, cx, cy);
        xml_text(f, label);
        fputs("</text>\n", f);
    }
    /* Row labels, "pos 3 (id 4)", left of the grid; a one-row panel holds for any
     * query. */
    for (int64_t i = 0; i < p->rows; i++) {
        if (i % L->label_every)
            continue;
        double cy = gy + (i + 0.5) * L->cell + 4;
        if (p->row_axis)
            pos_label(label, sizeof label, i, p->row_labels);
        else
            snprintf(label, sizeof label, "any query");
        fprintf(f, "<text class=\"label\" x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">", gx - 5, cy);
        xml_text(f, label);
        fputs("</text>\n", f);
    }
    /* Axis names: the key axis under the grid, the query axis turned along the left. */
    if (p->col_axis) {
        fprintf(f, "<text class=\"axis\" x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">", gx + gw / 2,
                gy + gh + 14);
        xml_text(f, p->col_axis);
        fputs(" pos (id) \xe2\x86\x92</text>\n", f); /* U+2192 rightwards arrow */
    }
    if (p->row_axis) {
        double ax = x0 + 10, ay = gy + gh / 2;
        fprintf(f, "<text class=\"axis\" x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" "
                   "transform=\"rotate(-90 %.1f %.1f)\">",
                ax, ay, ax, ay);
        xml_text(f, p->row_axis);
        fputs(" pos (id)</text>\n", f); /* rows go down: an arrow would point up */
    }

    char row[96], col[96];
    for (int64_t i = 0; i < p->rows; i++) {
        heatmap_describe(row, sizeof row, p->row_axis, i, p->row_labels);
        for (int64_t j = 0; j < p->cols; j++) {
            heatmap_describe(col, sizeof col, p->col_axis, j, p->col_labels);
            double v = cell_value(p, i, j);
            int masked = cell_masked(p, i, j);
            int rgb[3];
            cell_color(p, range, v, masked, rgb);
            double x = gx + (double)j * L->cell, y = gy + (double)i * L->cell;
            if (masked)
                fprintf(f, "<rect class=\"cell masked\" x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" "
                           "height=\"%.1f\" fill=\"url(#masked)\">",
                        x, y, L->cell, L->cell);
            else
                fprintf(f, "<rect class=\"cell\" x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" "
                           "height=\"%.1f\" fill=\"#%02x%02x%02x\">",
                        x, y, L->cell, L->cell, rgb[0], rgb[1], rgb[2]);
            fputs("<title>", f);
            xml_text(f, p->title);
            fputs(": ", f);
            xml_text(f, row);
            fputs(" \xe2\x86\x92 ", f);
            xml_text(f, col);
            if (p->kind == HEATMAP_MASK)
                fprintf(f, " = %d (%s)", v != 0.0 ? 1 : 0, v != 0.0 ? "may attend" : "masked");
            else if (p->kind == HEATMAP_SCORES && masked)
                fputs(" = -inf (masked)", f);
            else
                fprintf(f, " = %.6f%s", v, masked ? " (masked)" : "");
            fputs("</title></rect>\n", f);
            /* Masked weights stay bare hatch (their 0 is the mask's doing); a masked
             * score says -inf, a mask cell its 0 or 1. */
            if (L->in_cell_text && !(masked && p->kind == HEATMAP_WEIGHTS)) {
                char txt[32];
                if (p->kind == HEATMAP_SCORES && masked)
                    snprintf(txt, sizeof txt, "\xe2\x88\x92\xe2\x88\x9e"); /* U+2212 U+221E */
                else
                    cell_text(txt, sizeof txt, p, v, masked);
                int light = masked ? 1 : is_light(rgb);
                fprintf(f, "<text class=\"value\" x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" "
                           "fill=\"%s\">%s</text>\n",
                        x + L->cell / 2, y + L->cell / 2 + 3.5, light ? "#222" : "#fff", txt);
            }
        }
    }
    fprintf(f, "<rect class=\"frame\" x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" "
               "fill=\"none\" stroke=\"#555\" stroke-width=\"1\"/>\n</g>\n",
            gx, gy, gw, gh);
}

/* The keys are drawn twice: once with f NULL to measure them (the picture's height
 * must be known before its first line), then for real. */
static void lprintf(FILE *f, const char *fmt, ...)
{
    if (!f)
        return;
    va_list ap;
    va_start(ap, fmt);
    vfprintf(f, fmt, ap);
    va_end(ap);
}

/* One key entry: a swatch and up to two lines of text. Returns the height used. */
static double svg_swatch(FILE *f, double x, double y, const char *fill, const char *line1,
                         const char *line2)
{
    lprintf(f, "<rect class=\"key\" x=\"%.1f\" y=\"%.1f\" width=\"16\" height=\"16\" fill=\"%s\" "
               "stroke=\"#555\"/>\n<text x=\"%.1f\" y=\"%.1f\">",
            x, y, fill, x + 22, y + 12);
    xml_text(f, line1);
    lprintf(f, "</text>\n");
    if (line2) {
        lprintf(f, "<text x=\"%.1f\" y=\"%.1f\" fill=\"#666\">", x + 22, y + 26);
        xml_text(f, line2);
        lprintf(f, "</text>\n");
        return 40;
    }
    return 26;
}

/* A vertical colour bar with ticks; `labels` are bottom to top. Returns the height. */
static double svg_bar(FILE *f, double x, double y, const char *gradient, int nticks,
                      const double *ticks)
{
    const double bh = 110, bw = 16;
    lprintf(f, "<rect class=\"scale\" x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" "
               "fill=\"url(#%s)\" stroke=\"#555\"/>\n",
            x, y, bw, bh, gradient);
    for (int t = 0; t < nticks; t++) {
        double ty = y + bh - bh * t / (nticks - 1.0);
        lprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#555\"/>\n"
                   "<text x=\"%.1f\" y=\"%.1f\">%.2f</text>\n",
                x + bw, ty, x + bw + 4, ty, x + bw + 7, ty + 4, ticks[t]);
    }
    return bh + 10;
}

/* The keys, one group per kind of panel present, stacked at (x, y). Returns the
 * bottom. */
static double svg_legends(FILE *f, const heatmap_panel *panels, int n, double x, double y)
{
    int has[3] = {0, 0, 0};
    double range = 0.0;
    for (int k = 0; k < n; k++) {
        has[panels[k].kind] = 1;
        if (panels[k].kind == HEATMAP_SCORES) {
            double r = panel_range(&panels[k]);
            if (r > range)
                range = r;
        }
    }
    if (has[HEATMAP_WEIGHTS]) {
        const double ticks[5] = {0.0, 0.25, 0.5, 0.75, 1.0};
        lprintf(f, "<g class=\"legend legend-weights\">\n<text x=\"%.1f\" y=\"%.1f\" "
                   "font-weight=\"bold\">weights (after softmax)</text>\n",
                x, y + 12);
        y += 20;
        y += svg_bar(f, x, y, "scale", 5, ticks);
        y += svg_swatch(f, x, y, "url(#masked)", "masked: weight exactly 0", NULL);
        lprintf(f, "</g>\n");
        y += 12;
    }
    if (has[HEATMAP_SCORES]) {
        const double ticks[3] = {-range, 0.0, range};
        lprintf(f, "<g class=\"legend legend-scores\">\n<text x=\"%.1f\" y=\"%.1f\" "
                   "font-weight=\"bold\">scaled scores q\xc2\xb7k/\xe2\x88\x9a" "D</text>\n"
                   "<text x=\"%.1f\" y=\"%.1f\" fill=\"#666\">(before the softmax)</text>\n",
                x, y + 12, x, y + 26);
        y += 34;
        y += svg_bar(f, x, y, "scores", 3, ticks);
        y += svg_swatch(f, x, y, "url(#masked)", "\xe2\x88\x92\xe2\x88\x9e masked score",
                        "(softmax makes it 0)");
        lprintf(f, "</g>\n");
        y += 12;
    }
    if (has[HEATMAP_MASK]) {
        char fill[16];
        snprintf(fill, sizeof fill, "#%02x%02x%02x", mask_rgb[0], mask_rgb[1], mask_rgb[2]);
        lprintf(f, "<g class=\"legend legend-masks\">\n<text x=\"%.1f\" y=\"%.1f\" "
                   "font-weight=\"bold\">masks (bool)</text>\n",
                x, y + 12);
        y += 20;
        y += svg_swatch(f, x, y, fill, "1 = may attend", NULL);
        y += svg_swatch(f, x, y, "url(#masked)", "0 = masked", "(may not attend)");
        lprintf(f, "</g>\n");
        y += 12;
    }
    lprintf(f, "<text x=\"%.1f\" y=\"%.1f\" fill=\"#666\">hover a cell for its value</text>\n", x,
            y + 10);
    return y + 20;
}

int heatmap_write_svg(FILE *f, const char *title, const heatmap_panel *panels, int n,
                      int first_row, int per_row)
{
    if (n < 1)
        return -1;
    if (first_row < 1)
        first_row = 1;
    if (per_row < 1)
        per_row = 1;
    int64_t maxdim = 1;
    size_t maxlabel = 0;
    for (int k = 0; k < n; k++) {
        const heatmap_panel *p = &panels[k];
        if (p->rows > maxdim)
            maxdim = p->rows;
        if (p->cols > maxdim)
            maxdim = p->cols;
        char label[96];
        for (int64_t i = 0; i < p->rows; i++) {
            pos_label(label, sizeof label, i, p->row_labels);
            if (strlen(label) > maxlabel)
                maxlabel = strlen(label);
        }
        for (int64_t j = 0; j < p->cols; j++) {
            pos_label(label, sizeof label, j, p->col_labels);
            if (strlen(label) > maxlabel)
                maxlabel = strlen(label);
        }
    }
    if (maxlabel < 10)
        maxlabel = 10; /* "any query" */
    layout L;
    L.cell = 240.0 / (double)maxdim;
    if (L.cell > 34.0)
        L.cell = 34.0;
    if (L.cell < 3.0)
        L.cell = 3.0;
    L.label_every = (int64_t)ceil(14.0 / L.cell);
    if (L.label_every < 1)
        L.label_every = 1;
    L.in_cell_text = L.cell >= 28.0;
    /* About 6.2 px per character at 11 px; the turned column labels rise by sin 55. */
    L.label_w = 22 + 6.2 * (double)maxlabel;
    L.title_h = 26;
    L.collab_h = 10 + 6.2 * 0.82 * (double)maxlabel;
    L.foot_h = 22;
    L.gap = 18;

    /* Place the panels row by row. */
    double xs[256], ys[256];
    if (n > 256)
        return -1;
    double width = 0, y = 46, row_h = 0, x = 16;
    int in_row = 0, row_cap = first_row;
    for (int k = 0; k < n; k++) {
        if (in_row == row_cap || (panels[k].new_row && in_row > 0)) {
            y += row_h;
            x = 16;
            row_h = 0;
            in_row = 0;
            row_cap = per_row;
        }
        xs[k] = x;
        ys[k] = y;
        x += panel_w(&L, &panels[k]);
        if (x > width)
            width = x;
        double h = panel_h(&L, &panels[k]);
        if (h > row_h)
            row_h = h;
        in_row++;
    }
    double legend_x = width + 10;
    double height = y + row_h + 30;
    width = legend_x + 190;

    double legend_bottom = svg_legends(NULL, panels, n, legend_x, 60);
    if (height < legend_bottom + 10)
        height = legend_bottom + 10;

    fprintf(f, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
               "<svg xmlns=\"http://www.w3.org/2000/svg\" version=\"1.1\" width=\"%.0f\" "
               "height=\"%.0f\" viewBox=\"0 0 %.0f %.0f\" "
               "font-family=\"DejaVu Sans, Verdana, Arial, sans-serif\" font-size=\"11\">\n",
            width, height, width, height);
    fputs("<title>", f);
    xml_text(f, title);
    fputs("</title>\n<defs>\n"
          "<pattern id=\"masked\" patternUnits=\"userSpaceOnUse\" width=\"6\" height=\"6\" "
          "patternTransform=\"rotate(45)\">\n"
          "<rect class=\"hatch\" width=\"6\" height=\"6\" fill=\"#ececec\"/>\n"
          "<line x1=\"0\" y1=\"0\" x2=\"0\" y2=\"6\" stroke=\"#a8a8a8\" stroke-width=\"2.5\"/>\n"
          "</pattern>\n"
          "<linearGradient id=\"scale\" x1=\"0\" y1=\"1\" x2=\"0\" y2=\"0\">\n",
          f);
    for (int s = 0; s <= 10; s++)
        fprintf(f, "<stop offset=\"%d%%\" stop-color=\"#%02x%02x%02x\"/>\n", s * 10,
                scale_rgb[s][0], scale_rgb[s][1], scale_rgb[s][2]);
    fputs("</linearGradient>\n<linearGradient id=\"scores\" x1=\"0\" y1=\"1\" x2=\"0\" y2=\"0\">\n",
          f);
    for (int s = 0; s < 3; s++)
        fprintf(f, "<stop offset=\"%d%%\" stop-color=\"#%02x%02x%02x\"/>\n", s * 50,
                score_rgb[s][0], score_rgb[s][1], score_rgb[s][2]);
    fputs("</linearGradient>\n</defs>\n"
          "<style>.panel-title{font-size:13px;font-weight:bold;fill:#222}"
          ".label{fill:#333}.axis{fill:#666;font-style:italic}"
          ".value{font-size:9px;pointer-events:none}"
          ".cell{stroke:#fff;stroke-width:1}</style>\n",
          f);
    fprintf(f, "<rect class=\"background\" width=\"%.0f\" height=\"%.0f\" fill=\"#fff\"/>\n",
            width, height);
    fputs("<text x=\"16\" y=\"26\" font-size=\"16\" font-weight=\"bold\" fill=\"#111\">", f);
    xml_text(f, title);
    fputs("</text>\n", f);

    for (int k = 0; k < n; k++)
        svg_panel(f, &L, &panels[k], xs[k], ys[k]);
    svg_legends(f, panels, n, legend_x, 60);
    fputs("</svg>\n", f);
    return ferror(f) ? -1 : 0;
}

/* ------------------------------------------------------------------------------
 * Terminal
 * ---------------------------------------------------------------------------- */

/* The shading for a weight: a middle dot for exactly 0, then quarters. */
static const char *shade(double v)
{
    if (v <= 0.0)
        return "\xc2\xb7"; /* U+00B7 middle dot */
    if (v < 0.25)
        return "\xe2\x96\x91"; /* U+2591 light shade */
    if (v < 0.5)
        return "\xe2\x96\x92"; /* U+2592 medium shade */
    if (v < 0.75)
        return "\xe2\x96\x93"; /* U+2593 dark shade */
    return "\xe2\x96\x88";     /* U+2588 full block */
}

#define TIMES "\xc3\x97" /* U+00D7 multiplication sign: a masked cell */

static int digits(int64_t v)
{
    int d = v < 0 ? 2 : 1;
    while (v >= 10 || v <= -10) {
        v /= 10;
        d++;
    }
    return d;
}

/* Prints one cell of width w: `txt` centred (a number or '×', which is one column
 * wide but two bytes), or the weight's shading repeated. */
static void term_cell(FILE *f, const heatmap_panel *p, double range, double v, int masked, int w,
                      int color)
{
    char txt[32];
    int tw;
    if (color) {
        int rgb[3];
        cell_color(p, range, v, masked, rgb);
        int light = masked ? 0 : is_light(rgb);
        fprintf(f, "\x1b[48;2;%d;%d;%dm\x1b[38;2;%s", rgb[0], rgb[1], rgb[2],
                light ? "20;20;20m" : (masked ? "200;200;200m" : "240;240;240m"));
    }
    if (!color && p->kind == HEATMAP_WEIGHTS) {
        for (int c = 0; c < w; c++)
            fputs(masked ? TIMES : shade(v), f);
        return;
    }
    if (masked && p->kind != HEATMAP_SCORES) {
        snprintf(txt, sizeof txt, TIMES);
        tw = 1;
    } else {
        cell_text(txt, sizeof txt, p, v, masked);
        tw = (int)strlen(txt);
    }
    if (color) { /* centred on its colour */
        int left = (w - tw) / 2;
        fprintf(f, "%*s%s%*s\x1b[0m", left, "", txt, w - tw - left, "");
    } else { /* right-aligned, as numbers are */
        fprintf(f, "%*s%s", w - tw, "", txt);
    }
}

int heatmap_print_terminal(FILE *f, const heatmap_panel *panels, int n, int color)
{
    int has[3] = {0, 0, 0};
    for (int k = 0; k < n; k++) {
        const heatmap_panel *p = &panels[k];
        const double range = p->kind == HEATMAP_SCORES ? panel_range(p) : 1.0;
        has[p->kind] = 1;
        /* Cell width: the weights' shading is 3 wide (4 for "0.54" in colour); a
         * column is at least as wide as its position and token id. */
        int w = p->kind == HEATMAP_WEIGHTS ? (color ? 4 : 3) : p->kind == HEATMAP_MASK ? 3 : 4;
        char label[96];
        for (int64_t j = 0; j < p->cols; j++) {
            if (digits(j) > w)
                w = digits(j);
            if (p->col_labels && digits(p->col_labels[j]) > w)
                w = digits(p->col_labels[j]);
        }
        if (p->kind == HEATMAP_SCORES)
            for (int64_t i = 0; i < p->rows; i++)
                for (int64_t j = 0; j < p->cols; j++) {
                    cell_text(label, sizeof label, p, cell_value(p, i, j), cell_masked(p, i, j));
                    if ((int)strlen(label) > w)
                        w = (int)strlen(label);
                }
        int lw = 9; /* "any query" */
        for (int64_t i = 0; i < p->rows; i++) {
            pos_label(label, sizeof label, i, p->row_labels);
            if ((int)strlen(label) > lw)
                lw = (int)strlen(label);
        }
        fprintf(f, "%s", p->title);
        if (p->row_axis && p->col_axis)
            fprintf(f, "  (rows: %s pos (id), columns: %s pos (id))", p->row_axis, p->col_axis);
        else if (p->col_axis)
            fprintf(f, "  (one row, the same for every query; columns: %s pos (id))", p->col_axis);
        fputc('\n', f);
        /* Two header lines: the key positions, then their token ids. */
        fprintf(f, "%*s", lw, "pos");
        for (int64_t j = 0; j < p->cols; j++)
            fprintf(f, " %*" PRId64, w, j);
        fputc('\n', f);
        if (p->col_labels) {
            fprintf(f, "%*s", lw, "(id)");
            for (int64_t j = 0; j < p->cols; j++)
                fprintf(f, " %*" PRId64, w, p->col_labels[j]);
            fputc('\n', f);
        }
        for (int64_t i = 0; i < p->rows; i++) {
            if (p->row_axis)
                pos_label(label, sizeof label, i, p->row_labels);
            else
                snprintf(label, sizeof label, "any query");
            fprintf(f, "%*s", lw, label);
            for (int64_t j = 0; j < p->cols; j++) {
                fputc(' ', f);
                term_cell(f, p, range, cell_value(p, i, j), cell_masked(p, i, j), w, color);
            }
            fputc('\n', f);
        }
        fputc('\n', f);
    }
    if (has[HEATMAP_MASK])
        fputs(color ? "key, masks:   green 1 = may attend; grey " TIMES " = masked (may not attend)\n"
                    : "key, masks:   1 = may attend   " TIMES " = masked (may not attend)\n",
              f);
    if (has[HEATMAP_SCORES])
        fputs(color ? "key, scores:  q\xc2\xb7k/\xe2\x88\x9a" "D before the softmax, blue < 0 < red; "
                      "-inf = masked (the softmax makes it 0)\n"
                    : "key, scores:  q\xc2\xb7k/\xe2\x88\x9a" "D before the softmax; "
                      "-inf = masked (the softmax makes it 0)\n",
              f);
    if (has[HEATMAP_WEIGHTS])
        fputs(color ? "key, weights: colour from dark purple (0) to yellow (1), as in the SVG; "
                      "grey " TIMES " = masked (weight exactly 0)\n"
                    : "key, weights: \xc2\xb7 0   \xe2\x96\x91 <0.25   \xe2\x96\x92 <0.5   "
                      "\xe2\x96\x93 <0.75   \xe2\x96\x88 >=0.75   " TIMES
                      " masked (weight exactly 0)\n",
              f);
    return ferror(f) ? -1 : 0;
}
