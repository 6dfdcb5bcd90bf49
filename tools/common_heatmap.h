/*
 * common_heatmap.h - draws masks and attention weights as labelled heatmaps, as an
 * SVG file (for a browser: hover a cell to read its value) or in a terminal with
 * Unicode shading (and 24-bit colour when the output is a terminal).
 *
 * Used by inspect_self_attention's --heatmap and --show. Not part of libattn: it
 * only reads arrays the library computed.
 *
 * A heatmap is a list of panels; each panel is one 2-D array of values in [0, 1]
 * (attention weights, or a boolean mask as 0/1) with token ids on its axes. Cells
 * the mask forbids are drawn hatched ("masked") whatever their value, so a learner
 * sees at once that a masked key got weight 0 because of the mask.
 */
#ifndef TOOLS_COMMON_HEATMAP_H
#define TOOLS_COMMON_HEATMAP_H

#include <stdint.h>
#include <stdio.h>

typedef struct heatmap_panel {
    const char *title;       /* e.g. "head 0 weights"; shown above the panel */
    int64_t rows, cols;      /* >= 1 */
    const float *values;     /* value(i, j) = values[i * row_stride + j * col_stride] */
    int64_t row_stride, col_stride;
    const uint8_t *masked;   /* nonzero = masked cell; NULL = nothing masked */
    int64_t mask_row_stride, mask_col_stride; /* 0 broadcasts along that axis */
    const int64_t *row_labels; /* token id per row (query), or NULL */
    const int64_t *col_labels; /* token id per column (key), or NULL */
    const char *row_axis;    /* e.g. "query"; NULL for none */
    const char *col_axis;    /* e.g. "key" */
    int is_mask;             /* values are booleans: titles say "may attend"/"masked" */
} heatmap_panel;

/* Number of <rect class="cell"> elements heatmap_write_svg draws for these panels:
 * one per entry, rows * cols summed over the panels. */
int64_t heatmap_cell_count(const heatmap_panel *panels, int n);

/* Writes a standalone SVG document: `title` on top, the panels in a grid (the
 * first `first_row` panels on the first row, then up to `per_row` per row), a colour
 * scale from 0 to 1 and a key for masked cells. Every cell is a
 * <rect class="cell"> holding a <title> with its position, token ids and value.
 * Returns 0, or -1 if writing failed. */
int heatmap_write_svg(FILE *f, const char *title, const heatmap_panel *panels, int n,
                      int first_row, int per_row);

/* Prints the panels one after another with Unicode shading (' ' '░' '▒' '▓' '█'
 * for 0 and then by quarters; masked cells as '×'), token ids on the axes. With
 * `color` nonzero, each cell instead gets a 24-bit background colour from the same
 * scale as the SVG and shows its value ("0.54"; 1/0 for masks; '×' if masked).
 * Returns 0, or -1 if writing failed. */
int heatmap_print_terminal(FILE *f, const heatmap_panel *panels, int n, int color);

/* The colour scale (viridis-like, dark purple at 0 to yellow at 1) as 8-bit RGB. */
void heatmap_color(double value, int rgb[3]);

#endif /* TOOLS_COMMON_HEATMAP_H */
