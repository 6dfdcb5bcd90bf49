/*
 * train_attention.c - attention learning a task, with nothing but attn's forward
 * and backward and plain SGD: the chapter's module learns to reverse a short
 * sequence of tokens.
 *
 *   ids [B, T] (random tokens 1..V-1)
 *   x       = embed[ids] + pos            [B, T, E]   (a token and a position embedding)
 *   y       = attn_mha_forward(x)         [B, T, E]   (the chapter's module, no mask)
 *   logits  = y W_out^T + b_out           [B, T, V]
 *   loss    = cross-entropy(logits, ids reversed along T), averaged over B and T
 *
 * The backward goes the same way in reverse: dlogits = (softmax - one-hot) / (B T);
 * the output layer's gradients are two short loops here; attn_mha_backward gives dx
 * and the module's four gradients; dx lands on the rows of embed and pos that made
 * x. Every parameter then moves by -lr times its gradient.
 *
 * To reverse, the query at position t must find the key at position T-1-t, so the
 * attention picture of a trained model is the anti-diagonal: the program prints it
 * for one sequence before and after training, with the loss falling in between.
 */
#include "attn.h"
#include "common_cli.h"
#include "common_heatmap.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const prog = "train_attention";

static const char HELP[] =
    "NAME\n"
    "    train_attention - multi-head self-attention learns to reverse a sequence\n"
    "\n"
    "SYNOPSIS\n"
    "    train_attention [--steps N] [--seed N] [--lr R] [--seq-len T]\n"
    "\n"
    "DESCRIPTION\n"
    "    Trains a token embedding, a position embedding, the chapter's multi-head\n"
    "    self-attention (E = 32, H = 2) and an output layer on random sequences of\n"
    "    T tokens from a vocabulary of 8, to output each sequence reversed. Plain\n"
    "    SGD on batches of 32, the gradients from attn_mha_backward. Prints the\n"
    "    attention weights of head 0 for one sequence before training, the loss\n"
    "    (cross-entropy, averaged) and accuracy every tenth of the run, and the\n"
    "    weights again after: reversing shows as the anti-diagonal.\n"
    "\n"
    "OPTIONS\n"
    "    --steps N\n"
    "        SGD steps, 1..1000000 (default 600).\n"
    "    --seed N\n"
    "        Seed for the initial weights and the data, 0..2^63-1 (default 1).\n"
    "    --lr R\n"
    "        The learning rate, > 0 (default 0.1).\n"
    "    --seq-len T\n"
    "        Tokens per sequence, 2..16 (default 6).\n"
    "    -h, --help\n"
    "        Print this help and exit.\n"
    "\n"
    "    Options take their value as the next argument or after '=' (--lr=0.05).\n"
    "\n" CLI_HELP_NUMBERS
    "\n"
    "EXIT STATUS\n"
    "    0   success (and --help).\n"
    "    2   a usage error: an unknown, repeated or missing option, a missing value,\n"
    "        a bad number; nothing is trained.\n"
    "    1   training that diverges (a learning rate so large that the loss is no\n"
    "        longer a finite number: the step is named), or out of memory.\n"
    "    Every error prints exactly one line on stderr that names the problem.\n"
    "\n"
    "ENVIRONMENT\n"
    "    ATTN_ARCH\n"
    "        The instruction set the library's kernels run on (see 'attn --help');\n"
    "        the sums come in another order on each, so the printed losses may\n"
    "        differ in their last digits.\n"
    "\n"
    "EXAMPLES\n"
    "    train_attention\n"
    "    train_attention --steps 200 --seq-len 8 --lr 0.2\n"
    "\n"
    "SEE ALSO\n"
    "    inspect_self_attention --help (the chapter's experiment and --grad);\n"
    "    docs/gradients.md (the backward, and this program's run).\n";

enum { V = 8, E = 32, H = 2, BATCH = 32 };

typedef struct model {
    float *embed, *pos;      /* [V, E], [T, E] */
    attn_mha_weights w;      /* the chapter's module */
    float *w_out, *b_out;    /* [V, E], [V] */
} model;

/* Every parameter of the model as (data, count), in one list for init and SGD. */
typedef struct param_list {
    float *p[8];
    int64_t n[8];
} param_list;

static param_list params_of(model *m, int64_t T)
{
    param_list l = {{m->embed, m->pos, m->w.w_qkv.data, m->w.b_qkv.data, m->w.w_o.data,
                     m->w.b_o.data, m->w_out, m->b_out},
                    {V * E, T * E, 3 * E * E, 3 * E, E * E, E, V * E, V}};
    return l;
}

/* Draws a batch of token ids 1..V-1. */
static void draw_batch(attn_rng *rng, int64_t *ids, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        ids[i] = 1 + (int64_t)(attn_rng_u32(rng) % (V - 1));
}

/* One forward (and, with grads, backward) pass on ids [BATCH, T]; returns the mean
 * loss and sets *correct to the number of positions predicted right. */
typedef struct work {
    float *x, *y, *dy, *dx, *logits, *att;
    model g; /* gradients, laid out as the model */
} work;

static int step(attn_ctx *ctx, model *m, work *wk, const int64_t *ids, int64_t T, int backward,
                double *loss, int64_t *correct)
{
    const int64_t BT = BATCH * T;
    for (int64_t bt = 0; bt < BT; bt++)
        for (int64_t e = 0; e < E; e++)
            wk->x[bt * E + e] = m->embed[ids[bt] * E + e] + m->pos[(bt % T) * E + e];
    const int64_t s3[3] = {BATCH, T, E}, sa[4] = {BATCH, H, T, T};
    attn_tensor x, y, att;
    attn_tensor_init(ctx, &x, ATTN_DTYPE_F32, wk->x, 3, s3);
    attn_tensor_init(ctx, &y, ATTN_DTYPE_F32, wk->y, 3, s3);
    attn_tensor_init(ctx, &att, ATTN_DTYPE_F32, wk->att, 4, sa);
    int rc = attn_mha_forward(ctx, &m->w, H, &x, NULL, &y, &att);
    if (rc)
        return rc;
    *loss = 0.0;
    *correct = 0;
    for (int64_t bt = 0; bt < BT; bt++) {
        const int64_t b = bt / T, t = bt % T, target = ids[b * T + (T - 1 - t)];
        float *lg = wk->logits + bt * V;
        double mx = -INFINITY, sum = 0.0;
        int64_t best = 0;
        for (int64_t v = 0; v < V; v++) {
            double acc = m->b_out[v];
            for (int64_t e = 0; e < E; e++)
                acc += (double)wk->y[bt * E + e] * m->w_out[v * E + e];
            lg[v] = (float)acc;
            if (acc > mx) {
                mx = acc;
                best = v;
            }
        }
        for (int64_t v = 0; v < V; v++)
            sum += exp(lg[v] - mx);
        *loss += log(sum) + mx - lg[target];
        *correct += best == target;
        /* dlogits = (softmax - one-hot) / (B T), kept in place of the logits. */
        for (int64_t v = 0; v < V; v++)
            lg[v] = (float)((exp(lg[v] - mx) / sum - (v == target)) / (double)BT);
    }
    *loss /= (double)BT;
    if (!backward)
        return ATTN_OK;

    /* The output layer: dW_out = dlogits^T y, db_out, dy = dlogits W_out. */
    model *g = &wk->g;
    memset(g->w_out, 0, sizeof(float) * V * E);
    memset(g->b_out, 0, sizeof(float) * V);
    for (int64_t bt = 0; bt < BT; bt++) {
        const float *dl = wk->logits + bt * V;
        for (int64_t e = 0; e < E; e++) {
            double acc = 0.0;
            for (int64_t v = 0; v < V; v++) {
                acc += (double)dl[v] * m->w_out[v * E + e];
                g->w_out[v * E + e] += dl[v] * wk->y[bt * E + e];
            }
            wk->dy[bt * E + e] = (float)acc;
        }
        for (int64_t v = 0; v < V; v++)
            g->b_out[v] += dl[v];
    }
    /* The attention: attn_mha_backward, the one library call of the backward. */
    attn_tensor dy, dx;
    attn_tensor_init(ctx, &dy, ATTN_DTYPE_F32, wk->dy, 3, s3);
    attn_tensor_init(ctx, &dx, ATTN_DTYPE_F32, wk->dx, 3, s3);
    const attn_mha_grads mg = {&dx, &g->w.w_qkv, &g->w.b_qkv, &g->w.w_o, &g->w.b_o};
    if ((rc = attn_mha_backward(ctx, &m->w, H, &x, NULL, &dy, &mg)))
        return rc;
    /* The embeddings: each row of x came from one row of embed and one of pos. */
    memset(g->embed, 0, sizeof(float) * V * E);
    memset(g->pos, 0, sizeof(float) * (size_t)(T * E));
    for (int64_t bt = 0; bt < BT; bt++)
        for (int64_t e = 0; e < E; e++) {
            g->embed[ids[bt] * E + e] += wk->dx[bt * E + e];
            g->pos[(bt % T) * E + e] += wk->dx[bt * E + e];
        }
    return ATTN_OK;
}

/* Head 0's weights for sequence 0 of the last batch, as text. */
static void show(const work *wk, const int64_t *ids, int64_t T, const char *title)
{
    printf("\n%s\n", title);
    heatmap_panel panel;
    memset(&panel, 0, sizeof panel);
    panel.title = "head 0 weights";
    panel.rows = panel.cols = T;
    panel.values = wk->att;
    panel.row_stride = T;
    panel.col_stride = 1;
    panel.row_labels = ids;
    panel.col_labels = ids;
    panel.row_axis = "query";
    panel.col_axis = "key";
    panel.kind = HEATMAP_WEIGHTS;
    heatmap_print_terminal(stdout, &panel, 1, 0);
}

/* Allocates a model's arrays for sequence length T (zeros). */
static int model_alloc(attn_ctx *ctx, model *m, int64_t T)
{
    const int64_t s1[2] = {3 * E, E}, s2[1] = {3 * E}, s3[2] = {E, E}, s4[1] = {E};
    memset(m, 0, sizeof *m);
    m->embed = calloc(V * E, sizeof(float));
    m->pos = calloc((size_t)(T * E), sizeof(float));
    m->w_out = calloc(V * E, sizeof(float));
    m->b_out = calloc(V, sizeof(float));
    if (!m->embed || !m->pos || !m->w_out || !m->b_out)
        return ATTN_STATUS_NO_MEMORY;
    int rc;
    if ((rc = attn_tensor_alloc(ctx, &m->w.w_qkv, ATTN_DTYPE_F32, 2, s1)) ||
        (rc = attn_tensor_alloc(ctx, &m->w.b_qkv, ATTN_DTYPE_F32, 1, s2)) ||
        (rc = attn_tensor_alloc(ctx, &m->w.w_o, ATTN_DTYPE_F32, 2, s3)) ||
        (rc = attn_tensor_alloc(ctx, &m->w.b_o, ATTN_DTYPE_F32, 1, s4)))
        return rc;
    return ATTN_OK;
}

static void model_free(attn_ctx *ctx, model *m)
{
    free(m->embed);
    free(m->pos);
    free(m->w_out);
    free(m->b_out);
    attn_tensor_free(ctx, &m->w.w_qkv);
    attn_tensor_free(ctx, &m->w.b_qkv);
    attn_tensor_free(ctx, &m->w.w_o);
    attn_tensor_free(ctx, &m->w.b_o);
}

/* The one line on stderr when the loss stops being a finite number: the step after
 * which it happened and the learning rate to lower. */
static void diverged(int64_t step, double loss, double lr)
{
    fprintf(stderr, "%s: training diverged at step %" PRId64 ": the loss is %s; try a smaller "
            "--lr than %g (the default is 0.1)\n", prog, step, isnan(loss) ? "NaN" : "infinite",
            lr);
}

int main(int argc, char **argv)
{
    int64_t steps = 600, seed = 1, T = 6;
    float lr = 0.1f;
    cli_opt opts[] = {
        {"steps", CLI_INT, &steps, NULL, 1, 1000000, 0},
        {"seed", CLI_INT, &seed, NULL, 0, INT64_MAX, 0},
        {"lr", CLI_FLOAT, &lr, NULL, 0, 0, 0},
        {"seq-len", CLI_INT, &T, NULL, 2, 16, 0},
    };
    int rc = cli_parse(prog, argc, argv, opts, (int)(sizeof opts / sizeof opts[0]), HELP);
    if (rc != CLI_PARSED)
        return rc;
    if (!(lr > 0.0) || !isfinite(lr))
        return cli_usage_error(prog, "--lr must be a number > 0, not %g", (double)lr);

    attn_ctx ctx;
    cli_ctx_init(&ctx);
    model m, *g;
    work wk;
    memset(&wk, 0, sizeof wk);
    g = &wk.g;
    const int64_t BT = BATCH * T;
    int64_t *ids = malloc(sizeof(int64_t) * (size_t)BT);
    wk.x = malloc(sizeof(float) * (size_t)(BT * E));
    wk.y = malloc(sizeof(float) * (size_t)(BT * E));
    wk.dy = malloc(sizeof(float) * (size_t)(BT * E));
    wk.dx = malloc(sizeof(float) * (size_t)(BT * E));
    wk.logits = malloc(sizeof(float) * (size_t)(BT * V));
    wk.att = malloc(sizeof(float) * (size_t)(BATCH * H * T * T));
    rc = model_alloc(&ctx, &m, T) || model_alloc(&ctx, g, T);
    if (rc || !ids || !wk.x || !wk.y || !wk.dy || !wk.dx || !wk.logits || !wk.att) {
        fprintf(stderr, "%s: out of memory\n", prog);
        rc = 1;
        goto done;
    }

    /* N(0, 1) embeddings; nn.Linear's default initialisation for the three layers. */
    attn_rng rng;
    attn_rng_seed(&rng, (uint64_t)seed);
    attn_rng_randn(&rng, m.embed, V * E);
    attn_rng_randn(&rng, m.pos, T * E);
    attn_rng_linear_init(&rng, m.w.w_qkv.data, m.w.b_qkv.data, 3 * E, E);
    attn_rng_linear_init(&rng, m.w.w_o.data, m.w.b_o.data, E, E);
    attn_rng_linear_init(&rng, m.w_out, m.b_out, V, E);

    printf("task: reverse %" PRId64 " tokens from 1..%d; model: embedding + position "
           "embedding [%" PRId64 ", %d], attention E=%d H=%d, output layer [%d, %d]; "
           "SGD lr %g, batch %d\n",
           T, V - 1, T, E, E, H, V, E, (double)lr, BATCH);
    double loss = 0.0;
    int64_t correct = 0;
    draw_batch(&rng, ids, BT);
    if ((rc = step(&ctx, &m, &wk, ids, T, 0, &loss, &correct)))
        goto fail;
    show(&wk, ids, T, "before training: where each query looks (sequence 0, head 0)");
    printf("\nstep %7d  loss %.4f  accuracy %.3f\n", 0, loss, (double)correct / (double)BT);
    param_list pm = params_of(&m, T), pg = params_of(g, T);
    for (int64_t s = 1; s <= steps; s++) {
        draw_batch(&rng, ids, BT);
        if ((rc = step(&ctx, &m, &wk, ids, T, 1, &loss, &correct)))
            goto fail;
        /* A step too large sends the weights to infinity and the loss to NaN; every
         * later step would only print NaN, so say what happened and stop. */
        if (!isfinite(loss)) {
            diverged(s, loss, lr);
            rc = 1;
            goto done;
        }
        for (int i = 0; i < 8; i++)
            for (int64_t j = 0; j < pm.n[i]; j++)
                pm.p[i][j] -= lr * pg.p[i][j];
        if (s % (steps >= 10 ? steps / 10 : 1) == 0 || s == steps)
            printf("step %7" PRId64 "  loss %.4f  accuracy %.3f\n", s, loss,
                   (double)correct / (double)BT);
    }
    /* A fresh batch, not trained on, for the final numbers and the picture. */
    draw_batch(&rng, ids, BT);
    if ((rc = step(&ctx, &m, &wk, ids, T, 0, &loss, &correct)))
        goto fail;
    if (!isfinite(loss)) { /* the last update went to infinity */
        diverged(steps, loss, lr);
        rc = 1;
        goto done;
    }
    show(&wk, ids, T, "after training: where each query looks (sequence 0, head 0)");
    printf("\nfinal loss %.4f accuracy %.3f on a new batch\n", loss,
           (double)correct / (double)BT);
    rc = 0;
    goto done;
fail:
    fprintf(stderr, "%s: %s\n", prog, ctx.message[0] ? ctx.message : attn_strerror(rc));
    rc = 1;
done:
    model_free(&ctx, &m);
    model_free(&ctx, g);
    free(ids);
    free(wk.x);
    free(wk.y);
    free(wk.dy);
    free(wk.dx);
    free(wk.logits);
    free(wk.att);
    return rc;
}
