/*
 * common_heatmap.c - SVG and terminal heatmaps of masks and attention weights.
 * See common_heatmap.h for what is drawn; this file is only layout and escaping.
 *
 * The SVG is plain SVG 1.1 that any browser shows: one <rect class="cell"> per
 * entry with a <title> child (browsers show it as a tooltip), text labels with the
 * token ids, a hatch pattern for masked cells and a vertical colour scale.
 */
#include "common_heatmap.h"

#include <inttypes.h>
#include <math.h>
#include <string.h>

/* The colour scale: eleven evenly spaced samples of matplotlib's "viridis"
 * (van der Walt and Smith, 2015; perceptually uniform and readable in grey and by
 * most colour-blind readers), linearly interpolated between them. */
static const int scale_rgb[11][3] = {
    {0x44, 0x01, 0x54}, {0x48, 0x24, 0x75}, {0x41, 0x44, 0x87}, {0x35, 0x5f, 0x8d},
    {0x2a, 0x78, 0x8e}, {0x21, 0x91, 0x8c}, {0x22, 0xa8, 0x84}, {0x44, 0xbf, 0x70},
    {0x7a, 0xd1, 0x51}, {0xbd, 0xdf, 0x26}, {0xfd, 0xe7, 0x25},
};

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

/* Light colours get dark text and the other way round (Rec. 709 luma). */
static int is_light(const int rgb[3])
{
    return 0.2126 * rgb[0] + 0.7152 * rgb[1] + 0.0722 * rgb[2] > 140.0;
}

static double cell_value(const heatmap_panel *p, int64_t i, int64_t j)
{
    return (double)p->values[i * p->row_stride + j * p->col_stride];
}

static int cell_masked(const heatmap_panel *p, int64_t i, int64_t j)
{
    if (!p->masked)
        return 0;
    return p->masked[i * p->mask_row_stride + j * p->mask_col_stride] != 0;
}

int64_t heatmap_cell_count(const heatmap_panel *panels, int n)
{
    int64_t total = 0;
    for (int k = 0; k < n; k++)
        total += panels[k].rows * panels[k].cols;
    return total;
}

/* Writes text with the five XML special characters escaped. */
static void xml_text(FILE *f, const char *s)
{
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

/* "query 2 (token 3)" or "query 2" when there are no labels. */
static void describe_index(char *buf, size_t size, const char *axis, int64_t i,
                           const int64_t *labels)
{
    if (labels)
        snprintf(buf, size, "%s %" PRId64 " (token %" PRId64 ")", axis ? axis : "row", i,
                 labels[i]);
    else
        snprintf(buf, size, "%s %" PRId64, axis ? axis : "row", i);
}

/* The geometry shared by every panel of one picture. */
typedef struct layout {
    double cell;      /* cell side in px */
    double label_w;   /* room left of a panel for the row labels and the axis name */
    double title_h;   /* panel title */
    double collab_h;  /* column labels above the grid */
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
    fprintf(f, "<g class=\"panel\">\n<text class=\"panel-title\" x=\"%.1f\" y=\"%.1f\">", gx,
            y0 + L->title_h - 8);
    xml_text(f, p->title);
    fputs("</text>\n", f);

    /* Column labels: the key token ids, above the grid. */
    for (int64_t j = 0; j < p->cols; j++) {
        if (j % L->label_every)
            continue;
        double cx = gx + (j + 0.5) * L->cell;
        if (p->col_labels)
            fprintf(f, "<text class=\"label\" x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%" PRId64
                       "</text>\n",
                    cx, gy - 5, p->col_labels[j]);
    }
    /* Row labels: the query token ids, left of the grid. */
    for (int64_t i = 0; i < p->rows; i++) {
        if (i % L->label_every)
            continue;
        double cy = gy + (i + 0.5) * L->cell + 4;
        if (p->row_labels)
            fprintf(f, "<text class=\"label\" x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%" PRId64
                       "</text>\n",
                    gx - 5, cy, p->row_labels[i]);
    }
    /* Axis names: the key axis under the grid, the query axis turned along the left. */
    if (p->col_axis) {
        fprintf(f, "<text class=\"axis\" x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">", gx + gw / 2,
                gy + gh + 14);
        xml_text(f, p->col_axis);
        fputs(" token id \xe2\x86\x92</text>\n", f); /* U+2192 rightwards arrow */
    }
    if (p->row_axis) {
        double ax = x0 + 12, ay = gy + gh / 2;
        fprintf(f, "<text class=\"axis\" x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" "
                   "transform=\"rotate(-90 %.1f %.1f)\">",
                ax, ay, ax, ay);
        xml_text(f, p->row_axis);
        fputs(" token id</text>\n", f); /* rows go down: an arrow would point up */
    }
    if (!p->row_labels && p->rows == 1)
        fprintf(f, "<text class=\"label\" x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">any query</text>\n",
                gx - 5, gy + 0.5 * L->cell + 4);

    char row[96], col[96];
    for (int64_t i = 0; i < p->rows; i++) {
        describe_index(row, sizeof row, p->row_axis, i, p->row_labels);
        for (int64_t j = 0; j < p->cols; j++) {
            describe_index(col, sizeof col, p->col_axis, j, p->col_labels);
            double v = cell_value(p, i, j);
            int masked = cell_masked(p, i, j);
            int rgb[3];
            heatmap_color(v, rgb);
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
            if (p->is_mask)
                fprintf(f, " = %d (%s)", v != 0.0 ? 1 : 0, v != 0.0 ? "may attend" : "masked");
            else
                fprintf(f, " = %.6f%s", v, masked ? " (masked)" : "");
            fputs("</title></rect>\n", f);
            if (L->in_cell_text && !(masked && !p->is_mask)) {
                char txt[16];
                if (p->is_mask)
                    snprintf(txt, sizeof txt, "%d", v != 0.0 ? 1 : 0);
                else
                    snprintf(txt, sizeof txt, "%.2f", v);
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
    for (int k = 0; k < n; k++) {
        if (panels[k].rows > maxdim)
            maxdim = panels[k].rows;
        if (panels[k].cols > maxdim)
            maxdim = panels[k].cols;
    }
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
    L.label_w = 52;
    L.title_h = 26;
    L.collab_h = 16;
    L.foot_h = 22;
    L.gap = 18;

    /* Place the panels row by row. */
    double xs[256], ys[256];
    if (n > 256)
        return -1;
    double width = 0, y = 46, row_h = 0, x = 16;
    int in_row = 0, row_cap = first_row;
    for (int k = 0; k < n; k++) {
        if (in_row == row_cap) {
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
    if (height < 330)
        height = 330;
    width = legend_x + 170;

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

    /* The colour scale, 0 at the bottom and 1 at the top, and the key for masked. */
    const double bx = legend_x, by = 70, bh = 160, bw = 16;
    fprintf(f, "<g class=\"legend\">\n<text x=\"%.1f\" y=\"%.1f\" font-weight=\"bold\">value</text>\n",
            bx, by - 12);
    fprintf(f, "<rect class=\"scale\" x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" "
               "fill=\"url(#scale)\" stroke=\"#555\"/>\n",
            bx, by, bw, bh);
    for (int t = 0; t <= 4; t++) {
        double ty = by + bh - bh * t / 4.0;
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#555\"/>\n"
                   "<text x=\"%.1f\" y=\"%.1f\">%.2f</text>\n",
                bx + bw, ty, bx + bw + 4, ty, bx + bw + 7, ty + 4, t / 4.0);
    }
    fprintf(f, "<rect class=\"key\" x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" "
               "fill=\"url(#masked)\" stroke=\"#555\"/>\n"
               "<text x=\"%.1f\" y=\"%.1f\">masked</text>\n"
               "<text x=\"%.1f\" y=\"%.1f\" fill=\"#666\">(may not attend;</text>\n"
               "<text x=\"%.1f\" y=\"%.1f\" fill=\"#666\">weight exactly 0)</text>\n"
               "<text x=\"%.1f\" y=\"%.1f\" fill=\"#666\">masks: 1 = may attend</text>\n"
               "<text x=\"%.1f\" y=\"%.1f\" fill=\"#666\">hover a cell for its value</text>\n</g>\n",
            bx, by + bh + 24, bw, bw, bx + bw + 6, by + bh + 36, bx, by + bh + 56, bx,
            by + bh + 70, bx, by + bh + 90, bx, by + bh + 106);
    fputs("</svg>\n", f);
    return ferror(f) ? -1 : 0;
}

/* ------------------------------------------------------------------------------
 * Terminal
 * ---------------------------------------------------------------------------- */

/* The shading for a value: a middle dot for exactly 0, then quarters. */
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

static int digits(int64_t v)
{
    int d = v < 0 ? 2 : 1;
    while (v >= 10 || v <= -10) {
        v /= 10;
        d++;
    }
    return d;
}

int heatmap_print_terminal(FILE *f, const heatmap_panel *panels, int n, int color)
{
    for (int k = 0; k < n; k++) {
        const heatmap_panel *p = &panels[k];
        int w = color ? 4 : 3, lw = 5; /* colour mode prints "0.54" in each cell */
        for (int64_t j = 0; j < p->cols; j++)
            if (p->col_labels && digits(p->col_labels[j]) + 1 > w)
                w = digits(p->col_labels[j]) + 1;
        for (int64_t i = 0; i < p->rows; i++)
            if (p->row_labels && digits(p->row_labels[i]) + 1 > lw)
                lw = digits(p->row_labels[i]) + 1;
        fprintf(f, "%s", p->title);
        if (p->row_axis && p->col_axis)
            fprintf(f, "  (rows: %s token id, columns: %s token id)", p->row_axis, p->col_axis);
        else if (p->col_axis)
            fprintf(f, "  (one row, the same for every query; columns: %s token id)", p->col_axis);
        fputc('\n', f);
        fprintf(f, "%*s", lw, "");
        for (int64_t j = 0; j < p->cols; j++) {
            if (p->col_labels)
                fprintf(f, " %*" PRId64, w, p->col_labels[j]);
            else
                fprintf(f, " %*" PRId64, w, j);
        }
        fputc('\n', f);
        for (int64_t i = 0; i < p->rows; i++) {
            if (p->row_labels)
                fprintf(f, "%*" PRId64, lw, p->row_labels[i]);
            else
                fprintf(f, "%*s", lw, p->rows == 1 ? "all" : "");
            for (int64_t j = 0; j < p->cols; j++) {
                double v = cell_value(p, i, j);
                int masked = cell_masked(p, i, j);
                fputc(' ', f);
                if (color) {
                    int rgb[3];
                    heatmap_color(v, rgb);
                    if (masked)
                        fputs("\x1b[48;2;90;90;90m\x1b[38;2;200;200;200m", f);
                    else
                        fprintf(f, "\x1b[48;2;%d;%d;%dm\x1b[38;2;%s", rgb[0], rgb[1], rgb[2],
                                is_light(rgb) ? "20;20;20m" : "240;240;240m");
                }
                if (color) {
                    /* The background carries the shade, so the cell shows the number
                     * (a block character would paint over the colour). */
                    char txt[32];
                    if (masked)
                        snprintf(txt, sizeof txt, "\xc3\x97"); /* U+00D7 multiplication sign */
                    else if (p->is_mask)
                        snprintf(txt, sizeof txt, "%d", v != 0.0 ? 1 : 0);
                    else
                        snprintf(txt, sizeof txt, "%.2f", v);
                    int tw = masked ? 1 : (int)strlen(txt);
                    int left = (w - tw) / 2;
                    fprintf(f, "%*s%s%*s\x1b[0m", left, "", txt, w - tw - left, "");
                } else {
                    for (int c = 0; c < w; c++)
                        fputs(masked ? "\xc3\x97" /* U+00D7 multiplication sign */ : shade(v), f);
                }
            }
            fputc('\n', f);
        }
        fputc('\n', f);
    }
    if (color)
        fputs("key: colour from dark purple (0) to yellow (1), as in the SVG; "
              "\xc3\x97 masked (may not attend)\n",
              f);
    else
        fputs("key: \xc2\xb7 0   \xe2\x96\x91 <0.25   \xe2\x96\x92 <0.5   \xe2\x96\x93 <0.75   "
              "\xe2\x96\x88 >=0.75   \xc3\x97 masked (may not attend)\n",
              f);
    return ferror(f) ? -1 : 0;
}
