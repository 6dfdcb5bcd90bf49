/*
 * common_heatmap.h - draws masks, scaled scores and attention weights as labelled
 * heatmaps, as an SVG file (for a browser: hover a cell to read its value) or in a
 * terminal with Unicode shading (and 24-bit colour when the output is a terminal).
 *
 * Used by inspect_self_attention's --heatmap and --show. Not part of libattn: it
 * only reads arrays the library computed.
 *
 * A heatmap is a list of panels; each panel is one 2-D array with positions and
 * token ids on its axes, always written "pos P (id I)": P is where the token sits in
 * the sequence (the index a mask and a weight matrix use), I is its token id (what
 * the padding mask compares with the pad id). Three kinds of panel, each with its own
 * key, so no picture has to be read with another's legend:
 *
 *   masks    0/1; "may attend" in a solid colour, masked cells hatched;
 *   scores   the scaled scores q.k / sqrt(D) before the softmax, any real value on a
 *            blue-white-red scale around 0; masked cells are -inf and say so;
 *   weights  the softmax's output in [0, 1] on a dark-purple-to-yellow scale; masked
 *            cells are hatched, so a learner sees that their weight 0 comes from the
 *            mask.
 */
#ifndef TOOLS_COMMON_HEATMAP_H
#define TOOLS_COMMON_HEATMAP_H

#include <stdint.h>
#include <stdio.h>

/* What a panel's values are, which decides its colours, its cell text and its key. */
typedef enum heatmap_kind {
    HEATMAP_WEIGHTS = 0, /* values in [0, 1] (attention weights) */
    HEATMAP_MASK = 1,    /* booleans as 0/1: 1 = may attend */
    HEATMAP_SCORES = 2   /* any real value; -inf (or a masked cell) = masked score */
} heatmap_kind;

typedef struct heatmap_panel {
    const char *title;       /* e.g. "head 0 weights"; shown above the panel */
    int64_t rows, cols;      /* >= 1 */
    const float *values;     /* value(i, j) = values[i * row_stride + j * col_stride] */
    int64_t row_stride, col_stride;
    const uint8_t *masked;   /* nonzero = masked cell; NULL = nothing masked */
    int64_t mask_row_stride, mask_col_stride; /* 0 broadcasts along that axis */
    const int64_t *row_labels; /* token id per row position (query), or NULL */
    const int64_t *col_labels; /* token id per column position (key), or NULL */
    const char *row_axis;    /* e.g. "query"; NULL for none (a one-row panel that
                                holds for every query) */
    const char *col_axis;    /* e.g. "key" */
    heatmap_kind kind;
    double range;            /* HEATMAP_SCORES: the colours span [-range, range]; give
                                every score panel of a picture the same range so they
                                compare (<= 0: this panel's largest finite |value|) */
    int new_row;             /* nonzero: the SVG starts a new row of panels here */
} heatmap_panel;

/* Number of <rect class="cell"> elements heatmap_write_svg draws for these panels:
 * one per entry, rows * cols summed over the panels. */
int64_t heatmap_cell_count(const heatmap_panel *panels, int n);

/* "query pos 2 (id 3)" (with labels), "query pos 2" (without) or "any query" (for
 * axis NULL): how every title, label and legend names a position. */
void heatmap_describe(char *buf, size_t size, const char *axis, int64_t pos,
                      const int64_t *labels);

/* Writes a standalone SVG document: `title` on top, the panels in a grid (the
 * first `first_row` panels on the first row, then up to `per_row` per row, and a new
 * row wherever a panel asks for one), then a key per kind of panel present: the
 * weights' scale from 0 to 1, the scores' scale from -range to range with -inf, and
 * the masks' two states. Every cell is a <rect class="cell"> holding a <title> with
 * its panel, positions, token ids and value; masked cells have class "cell masked".
 * Returns 0, or -1 if writing failed. */
int heatmap_write_svg(FILE *f, const char *title, const heatmap_panel *panels, int n,
                      int first_row, int per_row);

/* Prints the panels one after another, positions and token ids on the axes. Without
 * colour: weights shaded (' ' '░' '▒' '▓' '█' for 0 and then by quarters), masks as
 * '1' and '×', scores as numbers with "-inf"; masked cells as '×' (weights, masks).
 * With `color` nonzero, each cell gets a 24-bit background from the SVG's scale for
 * its kind and shows its value ("0.54"; 1/0 for masks; "-inf" for masked scores).
 * A key for each kind present follows. Returns 0, or -1 if writing failed. */
int heatmap_print_terminal(FILE *f, const heatmap_panel *panels, int n, int color);

/* The weights' colour scale (viridis-like, dark purple at 0 to yellow at 1) as 8-bit
 * RGB. */
void heatmap_color(double value, int rgb[3]);

/* The scores' colour scale: blue at -range, near-white at 0, red at +range (values
 * beyond are clamped; -inf and NaN get the masked grey). */
void heatmap_score_color(double value, double range, int rgb[3]);

#endif /* TOOLS_COMMON_HEATMAP_H */
